"""The OpenAI endpoints: /v1/chat/completions, /v1/completions (completions_api.py) and
/v1/models.

Invariant: a request is checked whole before it is queued (a refusal is a RequestError naming
the field); once queued, the response carries what the engine committed (openai_api.py), and a
client that goes away cancels it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import exactdraft.server.completions_api as completions_api
import exactdraft.server.openai_api as openai_api
from exactdraft.engine import Submission
from exactdraft.scoring import token_logprobs
from exactdraft.server.completions_api import with_echo
from exactdraft.server.context import Call
from exactdraft.server.streaming import respond, sse, stream_error, whole


async def chat_completions(call: Call) -> Any:
    service = call.service
    wanted = openai_api.chat_request(await call.body(), service)
    submission, ids = await service.submit(wanted, "messages")
    reply = openai_api.Reply(service, True, wanted, ids)
    stream = _stream(call, reply, submission) if wanted.stream else None
    return await respond(call, submission, len(ids), reply, stream, reply.whole)


async def completions(call: Call) -> Any:
    """/v1/completions: one prompt or a list, `echo`, `max_tokens: 0` (completions_api)."""
    from starlette.responses import JSONResponse, StreamingResponse

    service = call.service
    prompts, wanted, echo = completions_api.completion_request(await call.body(), service)
    parts: list[tuple[Submission, list[int]]] = []
    try:
        for prompt in prompts:
            parts.append(await service.submit(replace(wanted, prompt=prompt), "prompt"))
        replies = [openai_api.Reply(service, False, wanted, ids) for _, ids in parts]
        for reply in replies[1:]:  # one response: one id and time
            reply.id, reply.created = replies[0].id, replies[0].created
        echoes = [await _echo(service, wanted, prompt, ids) if echo else None
                  for prompt, (_, ids) in zip(prompts, parts)]
    except BaseException:
        for submission, _ in parts:
            submission.cancel()
        raise
    if wanted.stream:
        return StreamingResponse(_completion_stream(call, replies, parts, echoes),
                                 media_type="text/event-stream")
    choices: list[dict[str, Any]] = []
    for p, ((submission, ids), reply, echoed) in enumerate(zip(parts, replies, echoes)):
        results = await whole(submission, call)
        call.count(len(ids), results, submission.cached_tokens[0])
        for j, (choice, result) in enumerate(zip(reply.whole(results)["choices"], results)):
            choice["index"] = p * wanted.n + j
            if echoed is not None:
                text, prompt_logprobs = echoed
                with_echo(choice, text, prompt_logprobs,
                          reply.logprobs(result.logprobs, len(text)))
            choices.append(choice)
    return JSONResponse({**replies[0].head(), "choices": choices, "usage": _usage(call)})


async def _echo(service: Any, wanted: Any, prompt: Any,
                ids: list[int]) -> tuple[str, dict[str, list] | None]:
    """A prompt's echoed text and, when logprobs are asked for, its tokens' logprobs (one
    prefill pass in a worker thread, between the engine's passes)."""
    text = completions_api.echo_text(service, prompt, ids)
    if wanted.logprobs is None:
        return text, None
    scored = await asyncio.to_thread(token_logprobs, service.generator, ids, start=1,
                                     n_prompt=len(ids), top=wanted.logprobs,
                                     sampling=dict(wanted.sampling))
    return text, completions_api.echo_logprobs(service, ids, scored)


def _usage(call: Call) -> dict[str, Any]:
    return {"prompt_tokens": call.prompt_tokens, "completion_tokens": call.completion_tokens,
            "total_tokens": call.prompt_tokens + call.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": call.cached_tokens}}


async def _completion_stream(call: Call, replies: list[openai_api.Reply],
                             parts: list[tuple[Submission, list[int]]],
                             echoes: list[Any]) -> AsyncIterator[str]:
    """Each prompt's chunks in turn (the engine runs them all meanwhile), indexes as in the
    whole response; an echoed choice's first chunk starts with its prompt."""
    n = replies[0].wanted.n
    try:
        for p, ((submission, _), reply, echoed) in enumerate(zip(parts, replies, echoes)):
            started: set[int] = set()
            offsets: dict[int, int] = {}
            base = 0 if echoed is None else len(echoed[0])
            async for j, chunk in submission:
                call.seen(chunk)
                if all(s.done for s, _ in parts) and not call.finished:
                    _count_all(call, parts)
                    call.finish(200)
                payload = reply.chunk(j, chunk, j not in started, offsets.get(j, base))
                choice = payload["choices"][0]
                choice["index"] = p * n + j
                if echoed is not None and j not in started:
                    with_echo(choice, echoed[0], echoed[1], choice["logprobs"])
                started.add(j)
                if chunk.logprobs:
                    offsets[j] = offsets.get(j, base) + sum(
                        len(reply.service.piece(t)) for t in chunk.tokens)
                yield sse(payload)
        if replies[0].wanted.include_usage:
            yield sse({**replies[0].head(), "choices": [], "usage": _usage(call)})
        yield "data: [DONE]\n\n"
    except Exception as error:
        call.finish(500)
        yield sse({"error": stream_error(error)})
    finally:
        for submission, _ in parts:
            submission.cancel()
        if not call.finished:  # the client went away
            _count_all(call, parts)
            call.finish(200)


def _count_all(call: Call, parts: list[tuple[Submission, list[int]]]) -> None:
    for submission, ids in parts:
        call.count_submission(submission, len(ids))


async def models(call: Call) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse(openai_api.models(call.service))


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
