"""Reading a submission for an HTTP response: whole (cancelled if the client goes away) or as
server-sent events.

Invariant: a submission whose client went away is cancelled, so the engine frees its sequences
and prefix-cache blocks at its next pass; an SSE event holds exactly one JSON payload (NaN and
infinities refused, as JSON has none).
"""

from __future__ import annotations

import asyncio
import json
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
