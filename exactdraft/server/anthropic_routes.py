"""The Anthropic endpoints: /v1/messages, whole or as its stream of events.

Invariant: a request is checked whole before it is queued (a refusal is a RequestError naming
the field); once queued, the message carries what the engine committed (anthropic_api.py), and
a client that goes away cancels it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import exactdraft.server.anthropic_api as anthropic_api
from exactdraft.engine import Submission
from exactdraft.server.context import Call
from exactdraft.server.streaming import respond, sse, stream_error


async def messages(call: Call) -> Any:
    service = call.service
    wanted = anthropic_api.messages_request(await call.body(), service)
    submission, ids = await service.submit(wanted, "messages")
    reply = anthropic_api.Reply(service, wanted, ids)
    stream = _stream(call, reply, submission) if wanted.stream else None
    return await respond(call, submission, len(ids), reply, stream, reply.whole)


async def count_tokens(call: Call) -> Any:
    """/v1/messages/count_tokens: the prompt tokens the same /v1/messages request has (its
    usage's input_tokens plus cache_read_input_tokens), whatever the context allows."""
    from starlette.responses import JSONResponse

    body = await call.body()
    if body.get("max_tokens") is None:  # not part of this request: the check needs one
        body = {**body, "max_tokens": 1}
    service = call.service
    wanted = anthropic_api.messages_request(body, service)
    return JSONResponse({"input_tokens": len(service.encode(wanted.prompt, "messages"))})


async def _stream(call: Call, reply: anthropic_api.Reply,
                  submission: Submission) -> AsyncIterator[str]:
    try:
        started = False
        async for _, chunk in submission:
            if not started:  # once running, the prefix cache has told what it held
                reply.cached_tokens = submission.cached_tokens[0]
                for event, payload in reply.start_events():
                    yield sse(payload, event)
                started = True
            call.seen(chunk)
            if submission.done and not call.finished:  # counted before the last event
                call.count_submission(submission, len(reply.prompt_ids))
                call.finish(200)
            for event, payload in reply.chunk_events(chunk):
                yield sse(payload, event)
    except Exception as error:
        call.finish(500)
        yield sse({"type": "error", "error": stream_error(error)}, "error")
    finally:
        submission.cancel()
        if not call.finished:  # the client went away
            call.count_submission(submission, len(reply.prompt_ids))
            call.finish(200)
