"""The ASGI application: routes, streaming, errors, disconnects and the bounded queue.

Invariant: every request gets an answer the client can parse, and the server keeps serving
whatever a request holds: a refused request (bad JSON, bad UTF-8, an unknown model, a bad field,
a prompt longer than the context) gets a 4xx JSON error naming the field, in the wire format of
its API; a full queue gets 429; an engine failure gets a 500 JSON error. A client that goes
away (mid-stream or while waiting for a whole response) cancels its request, which frees its
sequences and prefix-cache blocks at the engine's next pass. Responses carry exactly what the
engine committed (openai_api.py, anthropic_api.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import exactdraft.server.anthropic_api as anthropic_api
import exactdraft.server.openai_api as openai_api
from exactdraft.engine import Engine, Submission
from exactdraft.server.fields import RequestError, parse_body
from exactdraft.server.service import Service

DISCONNECT_POLL_SECONDS = 0.2


def create_app(engine: Engine, model_name: str,
               on_shutdown: Callable[[], None] | None = None) -> Any:
    """The Starlette application serving `engine` under `model_name`."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    service = Service(engine, model_name)

    def error_response(path: str, error: RequestError) -> Response:
        if path.startswith("/v1/messages"):
            body: dict[str, Any] = {"type": "error", "error": {
                "type": error.kind, "message": str(error), "param": error.param}}
        else:  # OpenAI names a missing model by its code
            code = "model_not_found" if error.status == 404 else None
            kind = "invalid_request_error" if error.status == 404 else error.kind
            body = {"error": {"message": str(error), "type": kind, "param": error.param,
                              "code": code}}
        return JSONResponse(body, status_code=error.status)

    async def openai_route(request: Request, chat: bool) -> Response:
        try:
            body = parse_body(await request.body())
            if chat:
                wanted = openai_api.chat_request(body, service)
            else:
                wanted = openai_api.completion_request(body, service)
            submission, ids = service.submit(wanted, "messages" if chat else "prompt")
        except RequestError as error:
            return error_response(request.url.path, error)
        reply = openai_api.Reply(service, chat, wanted, ids)
        if wanted.stream:
            return StreamingResponse(openai_stream(reply, submission),
                                     media_type="text/event-stream")
        results = await whole(submission, request)
        return JSONResponse(reply.whole(results))

    async def chat_completions(request: Request) -> Response:
        return await openai_route(request, chat=True)

    async def completions(request: Request) -> Response:
        return await openai_route(request, chat=False)

    async def messages(request: Request) -> Response:
        try:
            wanted = anthropic_api.messages_request(parse_body(await request.body()), service)
            submission, ids = service.submit(wanted, "messages")
        except RequestError as error:
            return error_response(request.url.path, error)
        reply = anthropic_api.Reply(service, wanted, ids)
        if wanted.stream:
            return StreamingResponse(anthropic_stream(reply, submission),
                                     media_type="text/event-stream")
        results = await whole(submission, request)
        return JSONResponse(reply.whole(results))

    async def models(request: Request) -> Response:
        return JSONResponse(openai_api.models(service))

    async def health(request: Request) -> Response:
        running, waiting = engine.load
        return JSONResponse({"status": "ok", "model": model_name, "running": running,
                             "waiting": waiting, "max_sequences": engine.max_sequences,
                             "max_waiting": engine.max_waiting,
                             "cancelled": engine.stats.cancelled})

    async def failure(request: Request, error: Exception) -> Response:
        wrapped = RequestError(f"the server failed on this request: "
                               f"{type(error).__name__}: {error}", None, 500, "api_error")
        return error_response(request.url.path, wrapped)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        if on_shutdown is not None:
            on_shutdown()

    return Starlette(routes=[
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ], exception_handlers={Exception: failure}, lifespan=lifespan)


async def whole(submission: Submission, request: Any) -> list[Any]:
    """Every result of a submission, cancelling it if the client goes away meanwhile."""
    async def watch() -> None:
        while not submission.done:
            if await request.is_disconnected():
                submission.cancel()
                return
            await asyncio.sleep(DISCONNECT_POLL_SECONDS)

    watcher = asyncio.create_task(watch())
    try:
        async for _ in submission:
            pass
    finally:
        watcher.cancel()
        submission.cancel()  # a no-op once done; frees the samples if this task was cancelled
    return submission.results()


def sse(payload: dict[str, Any], event: str | None = None) -> str:
    data = json.dumps(payload, allow_nan=False)
    return (f"event: {event}\n" if event else "") + f"data: {data}\n\n"


def stream_error(error: BaseException) -> dict[str, Any]:
    return {"type": "api_error", "message": f"{type(error).__name__}: {error}"}


async def openai_stream(reply: openai_api.Reply, submission: Submission) -> AsyncIterator[str]:
    started: set[int] = set()
    offsets: dict[int, int] = {}
    completion = 0
    try:
        async for index, chunk in submission:
            yield sse(reply.chunk(index, chunk, index not in started, offsets.get(index, 0)))
            started.add(index)
            if chunk.logprobs:  # completions' text_offset counts the token pieces so far
                offsets[index] = offsets.get(index, 0) + sum(
                    len(reply.service.piece(t)) for t in chunk.tokens)
            completion += len(chunk.tokens)
        if reply.wanted.include_usage:
            yield sse(reply.usage_chunk(completion))
        yield "data: [DONE]\n\n"
    except Exception as error:  # an engine failure after the headers went out
        yield sse({"error": stream_error(error)})
    finally:
        submission.cancel()  # the client went away (or the stream ended): free its sequences


async def anthropic_stream(reply: anthropic_api.Reply,
                           submission: Submission) -> AsyncIterator[str]:
    try:
        for event, payload in reply.start_events():
            yield sse(payload, event)
        async for _, chunk in submission:
            for event, payload in reply.chunk_events(chunk):
                yield sse(payload, event)
    except Exception as error:
        yield sse({"type": "error", "error": stream_error(error)}, "error")
    finally:
        submission.cancel()
