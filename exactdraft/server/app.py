"""The ASGI application: the endpoint table (endpoints.py) mounted, with errors in each API's
wire format.

Invariant: every request gets an answer the client can parse, and the server keeps serving
whatever a request holds: a refused request (bad JSON, bad UTF-8, a bad field, a prompt longer
than the context) gets a 4xx JSON error naming the field, in the wire format of its endpoint; a
full queue gets 429; a request's failure gets a 500 JSON error; once the engine has stopped
after a failure (EngineFailed: a dead tensor-parallel rank, a pass that raised), every request
gets a 503 naming the cause and /health answers 503 (operations.py). A client that goes away
(mid-stream or while waiting for a whole response) cancels its request, which frees its
sequences and prefix-cache blocks at the engine's next pass. Responses carry exactly what the engine
committed (openai_api.py, anthropic_api.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from exactdraft.engine import Engine, EngineFailed
from exactdraft.server.context import Call, Shared
from exactdraft.server.endpoints import ENDPOINTS, Endpoint
from exactdraft.server.fields import RequestError
from exactdraft.server.metrics import Metrics
from exactdraft.server.metrics import available as metrics_available
from exactdraft.server.service import Service


def create_app(engine: Engine, model_name: str,
               on_shutdown: Callable[[], None] | None = None,
               model_aliases: Mapping[str, str] | None = None,
               clamp_max_tokens: bool = False, thinking_key: bytes | None = None) -> Any:
    """The Starlette application serving `engine` under `model_name`. Requests may name any
    model unless `model_aliases` ({alias: model_name}) is given; then only `model_name` and
    the aliases are served; `clamp_max_tokens` lowers a max_tokens past the context's room
    instead of refusing it; `thinking_key` signs Anthropic thinking blocks (service.Service
    says more)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    service = Service(engine, model_name, model_aliases, clamp_max_tokens, thinking_key)
    shared = Shared(service, engine, model_name, on_shutdown)
    if metrics_available():
        shared.metrics = Metrics(model_name, lambda: engine.load, service.kv_usage,
                                 lambda: engine.failure is None)
    wires = {endpoint.path: endpoint.wire for endpoint in ENDPOINTS}

    async def failure(request: Any, error: Exception) -> Any:
        return error_response(wires.get(request.url.path, "openai"), failed(error))

    async def no_route(request: Any, error: Exception) -> Any:
        """An unknown route or method, answered in the error shape of the API the client
        speaks (an Anthropic client sends anthropic-version)."""
        anthropic = "anthropic-version" in request.headers or \
            request.url.path.startswith("/v1/messages")
        status = getattr(error, "status_code", 404)
        what = "route" if status == 404 else "method for the route"
        return error_response("anthropic" if anthropic else "openai", RequestError(
            f"this server has no {what} {request.method} {request.url.path}", None, status,
            "not_found_error" if status == 404 else "invalid_request_error"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        if on_shutdown is not None:
            on_shutdown()

    routes = [Route(e.path, route(e, shared), methods=[e.method]) for e in ENDPOINTS]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={Exception: failure, HTTPException: no_route})


def route(endpoint: Endpoint, shared: Shared) -> Callable[[Any], Awaitable[Any]]:
    """The Starlette handler of one endpoint: its own handler, given a Call, with refusals
    and failures answered in the endpoint's wire format."""
    handler = endpoint.load()

    from starlette.responses import StreamingResponse

    async def handle(request: Any) -> Any:
        call = Call(request, shared, quiet=endpoint.quiet)
        try:
            response = await handler(call)
        except RequestError as error:
            response = error_response(endpoint.wire, error)
        except Exception as error:
            response = error_response(endpoint.wire, failed(error))
        if not isinstance(response, StreamingResponse):  # a stream finishes its call itself
            call.finish(response.status_code)
        return response

    return handle


def failed(error: Exception) -> RequestError:
    if isinstance(error, EngineFailed):  # the server is going down: a supervisor restarts it
        return RequestError(f"the server cannot serve: {error}", None, 503, "api_error")
    return RequestError(f"the server failed on this request: {type(error).__name__}: {error}",
                        None, 500, "api_error")


def error_response(wire: str, error: RequestError) -> Any:
    from starlette.responses import JSONResponse

    message = error.wording(wire)
    if wire == "anthropic":
        body: dict[str, Any] = {"type": "error", "error": {
            "type": error.kind, "message": message, "param": error.param}}
    else:  # OpenAI calls a missing model or route an invalid request, with a code
        kind = "invalid_request_error" if error.status == 404 else error.kind
        body = {"error": {"message": message, "type": kind, "param": error.param,
                          "code": error.code}}
    return JSONResponse(body, status_code=error.status)
