"""The OpenAI Responses API, stateless: POST /v1/responses, whole or as its stream of events.

Invariant: a response carries exactly what the engine committed for its one output message
(the text, the status: "completed" at a stop token, "incomplete" with reason
max_output_tokens at the length or context limit, the token counts and, as exactdraft's
extension, the receipt), and the streamed `response.output_text.delta` events concatenate to
that text. Nothing is stored: the whole conversation comes in `input` (a string, or message
items whose content is a string or text parts), `instructions` become the system prompt, and
`previous_response_id` is refused, as are tools and output formats other than text. Other
optional fields (`store`, `metadata`, `reasoning`, `include`, ...) are accepted and ignored.
Extensions, as on the other endpoints: `top_k`, `min_p`, `repetition_penalty`, `seed` and
`drafts` (false: serial decoding).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from exactdraft.decoding import GenerationResult
from exactdraft.engine import Submission
from exactdraft.server.context import Call
from exactdraft.server.fields import (
    ROLES,
    RequestError,
    Wanted,
    chat_messages,
    checked_text,
    integer,
    refuse_unsupported,
    sampling_fields,
    typed,
)
from exactdraft.server.service import Service
from exactdraft.server.streaming import respond, sse, stream_error

SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
            "min_p": "min_p", "repetition_penalty": "repetition_penalty", "seed": "seed"}
UNSUPPORTED = ("previous_response_id", "conversation", "tools", "background", "prompt")
TEXT_PARTS = ("input_text", "output_text", "text")


async def responses(call: Call) -> Any:
    service = call.service
    body = await call.body()
    wanted = responses_request(body, service)
    submission, ids = await service.submit(wanted, "input")
    reply = Reply(service, wanted, ids, body.get("instructions"))
    stream = _stream(call, reply, submission) if wanted.stream else None
    return await respond(call, submission, len(ids), reply, stream,
                         lambda results: reply.response(results[0]))


def responses_request(body: Mapping[str, Any], service: Service) -> Wanted:
    refuse_unsupported(body, UNSUPPORTED)
    service.check_model(dict(body))
    text = typed(body, "text", (dict,), "an object", {})
    if text.get("format") not in (None, {"type": "text"}):
        raise RequestError("text.format other than text is not supported", "text.format")
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise RequestError("instructions must be a string", "instructions")
        messages.append({"role": "system", "content": checked_text(instructions,
                                                                   "instructions")})
    messages += input_messages(body.get("input"))
    return Wanted(prompt=chat_messages(messages, "input"),
                  max_tokens=integer(body, "max_output_tokens", 1, service.target.max_context),
                  stream=typed(body, "stream", (bool,), "true or false", False),
                  drafts=typed(body, "drafts", (bool,), "true or false", True),
                  sampling=sampling_fields(body, SAMPLING))


def input_messages(value: Any) -> list[dict[str, str]]:
    """`input` as chat messages: a string is one user message; message items keep their role
    (reasoning items, which carry nothing a stateless server can use, are skipped)."""
    if isinstance(value, str) and value:
        return [{"role": "user", "content": checked_text(value, "input")}]
    if not isinstance(value, list) or not value:
        raise RequestError("input must be a non-empty string or a list of message items",
                           "input")
    messages = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be a message item", where)
        kind = item.get("type", "message")
        if kind == "reasoning":
            continue
        if kind != "message":
            raise RequestError(f"{where}.type {kind!r} is not supported (message items only)",
                               f"{where}.type")
        role = item.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(sorted(ROLES))}",
                               f"{where}.role")
        messages.append({"role": role, "content": _content(item.get("content"), where)})
    return messages


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return checked_text(content, f"{where}.content")
    if not isinstance(content, list):
        raise RequestError(f"{where}.content must be a string or a list of text parts",
                           f"{where}.content")
    parts = []
    for index, part in enumerate(content):
        name = f"{where}.content[{index}]"
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or \
                not isinstance(part.get("text"), str):
            raise RequestError(f"{name} must be a text part ({{\"type\": \"input_text\", "
                               "\"text\": ...}); only text is supported", name)
        parts.append(checked_text(part["text"], name))
    return "".join(parts)


class Reply:
    def __init__(self, service: Service, wanted: Wanted, prompt_ids: list[int],
                 instructions: str | None = None) -> None:
        self.service, self.wanted, self.prompt_ids = service, wanted, prompt_ids
        self.instructions = instructions
        self.id = "resp_" + uuid.uuid4().hex
        self.item_id = "msg_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.cached_tokens = 0  # prompt tokens taken from the prefix cache, once known
        self.sequence = 0  # the stream's next sequence_number

    def response(self, result: GenerationResult | None) -> dict[str, Any]:
        """The response object: in progress (no result yet) or finished."""
        sampling = self.wanted.sampling
        body: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": "in_progress", "error": None, "incomplete_details": None,
            "instructions": self.instructions, "max_output_tokens": self.wanted.max_tokens,
            "model": self.service.model_name, "output": [], "parallel_tool_calls": False,
            "previous_response_id": None, "store": False,
            "temperature": sampling.get("temperature"), "top_p": sampling.get("top_p"),
            "text": {"format": {"type": "text"}}, "tool_choice": "none", "tools": [],
            "truncation": "disabled", "usage": None, "metadata": {}}
        if result is None:
            return body
        length = result.finish_reason in ("length", "context")
        body["status"] = "incomplete" if length else "completed"
        if length:
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        body["output"] = [self.item(result.text or "", "completed")]
        prompt, output = len(self.prompt_ids), len(result.tokens)
        body["usage"] = {"input_tokens": prompt,
                         "input_tokens_details": {"cached_tokens": self.cached_tokens},
                         "output_tokens": output,
                         "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": prompt + output}
        body["receipt"] = self.service.receipt(result)
        return body

    def item(self, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [self.part(text)]
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant",
                "content": content}

    @staticmethod
    def part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(payload, kind)


async def _stream(call: Call, reply: Reply, submission: Submission) -> AsyncIterator[str]:
    where = {"item_id": reply.item_id, "output_index": 0, "content_index": 0}
    text = ""
    try:
        yield reply.event("response.created", response=reply.response(None))
        yield reply.event("response.in_progress", response=reply.response(None))
        yield reply.event("response.output_item.added", output_index=0,
                          item=reply.item(None, "in_progress"))
        yield reply.event("response.content_part.added", part=reply.part(""), **where)
        async for _, chunk in submission:
            call.seen(chunk)
            if chunk.text:
                text += chunk.text
                yield reply.event("response.output_text.delta", delta=chunk.text, logprobs=[],
                                  **where)
            if chunk.result is None:
                continue
            call.count_submission(submission, len(reply.prompt_ids))
            call.finish(200)
            reply.cached_tokens = submission.cached_tokens[0]
            final = reply.response(chunk.result)
            yield reply.event("response.output_text.done", text=text, logprobs=[], **where)
            yield reply.event("response.content_part.done", part=reply.part(text), **where)
            yield reply.event("response.output_item.done", output_index=0,
                              item=final["output"][0])
            done = "response.completed" if final["status"] == "completed" else \
                "response.incomplete"
            yield reply.event(done, response=final)
    except Exception as error:
        call.finish(500)
        yield reply.event("error", code="api_error", message=stream_error(error)["message"],
                          param=None)
    finally:
        submission.cancel()
        if not call.finished:  # the client went away
            call.count_submission(submission, len(reply.prompt_ids))
            call.finish(200)
