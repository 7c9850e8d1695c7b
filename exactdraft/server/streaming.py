"""Reading a submission for an HTTP response: whole (cancelled if the client goes away) or as
server-sent events.

Invariant: a submission whose client went away is cancelled, so the engine frees its sequences
and prefix-cache blocks at its next pass; an SSE event holds exactly one JSON payload (NaN and
infinities refused, as JSON has none).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from exactdraft.engine import Submission
from exactdraft.server.context import Call

DISCONNECT_POLL_SECONDS = 0.2


async def whole(submission: Submission, call: Call) -> list[Any]:
    """Every result of a submission, cancelling it if the client goes away meanwhile."""
    async def watch() -> None:
        while not submission.done:
            if await call.request.is_disconnected():
                submission.cancel()
                return
            await asyncio.sleep(DISCONNECT_POLL_SECONDS)

    watcher = asyncio.create_task(watch())
    try:
        async for _, chunk in submission:
            call.seen(chunk)
    finally:
        watcher.cancel()
        submission.cancel()  # a no-op once done; frees the samples if this task was cancelled
    return submission.results()


def sse(payload: dict[str, Any], event: str | None = None) -> str:
    data = json.dumps(payload, allow_nan=False)
    return (f"event: {event}\n" if event else "") + f"data: {data}\n\n"


def stream_error(error: BaseException) -> dict[str, Any]:
    return {"type": "api_error", "message": f"{type(error).__name__}: {error}"}


async def respond(call: Call, submission: Submission, prompt_tokens: int, reply: Any,
                  stream: AsyncIterator[str] | None, body: Callable[[list[Any]], Any]) -> Any:
    """How a generating route answers: the SSE `stream` when the request streams (not None),
    else the JSON `body(results)` once every result is in, its usage counted and its cached
    prompt tokens on the reply."""
    from starlette.responses import JSONResponse, StreamingResponse

    if stream is not None:
        return StreamingResponse(stream, media_type="text/event-stream")
    results = await whole(submission, call)
    call.count_submission(submission, prompt_tokens)
    reply.cached_tokens = submission.cached_tokens[0]
    return JSONResponse(body(results))
