"""The OpenAI endpoints: /v1/chat/completions, /v1/completions and /v1/models.

Invariant: a request is checked whole before it is queued (a refusal is a RequestError naming
the field); once queued, the response carries what the engine committed (openai_api.py), and a
client that goes away cancels it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import exactdraft.server.openai_api as openai_api
from exactdraft.engine import Submission
from exactdraft.server.context import Call
from exactdraft.server.streaming import sse, stream_error, whole


async def chat_completions(call: Call) -> Any:
    return await _generate(call, chat=True)


async def completions(call: Call) -> Any:
    return await _generate(call, chat=False)


async def models(call: Call) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(openai_api.models(call.service))


async def _generate(call: Call, chat: bool) -> Any:
    from starlette.responses import JSONResponse, StreamingResponse

    body = await call.body()
    service = call.service
    wanted = openai_api.chat_request(body, service) if chat else \
        openai_api.completion_request(body, service)
    submission, ids = service.submit(wanted, "messages" if chat else "prompt")
    reply = openai_api.Reply(service, chat, wanted, ids)
    if wanted.stream:
        return StreamingResponse(_stream(call, reply, submission),
                                 media_type="text/event-stream")
    results = await whole(submission, call)
    call.count_submission(submission, len(ids))
    reply.cached_tokens = submission.cached_tokens[0]
    return JSONResponse(reply.whole(results))


async def _stream(call: Call, reply: openai_api.Reply,
                  submission: Submission) -> AsyncIterator[str]:
    started: set[int] = set()
    offsets: dict[int, int] = {}
    completion = 0
    try:
        async for index, chunk in submission:
            call.seen(chunk)
            if submission.done and not call.finished:  # counted before the last event
                call.count_submission(submission, len(reply.prompt_ids))
                call.finish(200)
            yield sse(reply.chunk(index, chunk, index not in started, offsets.get(index, 0)))
            started.add(index)
            if chunk.logprobs:  # completions' text_offset counts the token pieces so far
                offsets[index] = offsets.get(index, 0) + sum(
                    len(reply.service.piece(t)) for t in chunk.tokens)
            completion += len(chunk.tokens)
        if reply.wanted.include_usage:
            reply.cached_tokens = submission.cached_tokens[0]
            yield sse(reply.usage_chunk(completion))
        yield "data: [DONE]\n\n"
    except Exception as error:  # an engine failure after the headers went out
        call.finish(500)
        yield sse({"error": stream_error(error)})
    finally:
        submission.cancel()  # the client went away (or the stream ended): free its sequences
        if not call.finished:  # the client went away
            call.count_submission(submission, len(reply.prompt_ids))
            call.finish(200)
