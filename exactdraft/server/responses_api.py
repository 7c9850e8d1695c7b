"""The OpenAI Responses API: POST /v1/responses, whole or as its stream of events, with
function tools and `previous_response_id`.

Invariant: a response carries exactly what the engine committed (its output items, made from
the model's text by responses_output.py: the text and, with tools, a `function_call` item per
call; the status: "completed" at a stop token, "incomplete" with reason max_output_tokens at
the length or context limit; the token counts and, as exactdraft's extension, the receipt),
and the streamed events assemble to that output. The conversation is `input` (a string, or
message, function_call and function_call_output items: responses_input.py), after the stored
conversation of `previous_response_id` when given (responses_store.py: recent responses, in
memory), with `instructions` as the system prompt. Tools are function tools and compile to the
same prompt and constraint as on /v1/chat/completions (tools.py). Refused: `conversation`,
`background`, `prompt`, tools of other types and output formats other than text. Other
optional fields (`metadata`, `reasoning`, `include`, `truncation`, ...) are accepted and
ignored. Where the chat template has reasoning (server/reasoning/), the reasoning is a
`reasoning` output item, and the usage's `output_tokens_details.reasoning_tokens` counts its
generated tokens, markup included (server/reasoning/usage.py). Extensions, as on the other
endpoints: `top_k`, `min_p`, `repetition_penalty`, `seed`, `drafts` (false: serial decoding)
and `separate_reasoning`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import exactdraft.server.tool_calls.histories as histories
import exactdraft.server.tool_calls.requests as tools
from exactdraft.decoding import GenerationResult
from exactdraft.engine import Submission
from exactdraft.server.context import Call
from exactdraft.server.fields import (
    MAX_TOKENS_LIMIT,
    RequestError,
    Wanted,
    chat_messages,
    checked_text,
    constraint_from,
    integer,
    refuse_unsupported,
    sampling_fields,
    separate_reasoning,
    typed,
)
from exactdraft.server.reasoning.formats import reasoning_splitters
from exactdraft.server.reasoning.usage import reasoning_counter
from exactdraft.server.responses_input import input_messages, tool_request
from exactdraft.server.responses_output import OutputItems
from exactdraft.server.responses_store import ResponseStore
from exactdraft.server.service import Service
from exactdraft.server.streaming import respond, sse, stream_error

UNSUPPORTED = ("conversation", "background", "prompt")
INCOMPLETE = ("length", "context", "incomplete")  # finish reasons of an incomplete response


async def responses(call: Call) -> Any:
    service = call.service
    body = await call.body()
    request = responses_request(body, service, call.shared.responses)
    submission, ids = await service.submit(request.wanted, "input")
    reply = Reply(service, request, ids, call.shared.responses)
    stream = _stream(call, reply, submission) if request.wanted.stream else None
    return await respond(call, submission, len(ids), reply, stream,
                         lambda results: reply.response(results[0]))


@dataclass
class Request:
    """A checked request: what the engine is asked for, the conversation so far (without the
    instructions), and the fields the response repeats."""

    wanted: Wanted
    conversation: list[dict[str, Any]]
    tools: tools.ToolRequest | None
    echoed: dict[str, Any]
    store: bool


def responses_request(body: Mapping[str, Any], service: Service,
                      store: ResponseStore) -> Request:
    refuse_unsupported(body, UNSUPPORTED)
    service.check_model(dict(body))
    text = typed(body, "text", (dict,), "an object", {})
    if text.get("format") not in (None, {"type": "text"}):
        raise RequestError("text.format other than text is not supported", "text.format")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise RequestError("instructions must be a string", "instructions")
    previous = body.get("previous_response_id")
    conversation = [] if previous is None else store.conversation(previous)
    calls = {c["id"]: c["function"]["name"] for m in conversation for c in m.get("tool_calls", [])}
    conversation += input_messages(body.get("input"), calls)
    messages = conversation if instructions is None else \
        [{"role": "system", "content": checked_text(instructions, "instructions")},
         *conversation]
    request = tool_request(body, getattr(service.tokenizer, "chat_template", None))
    if request is not None or histories.uses_tools(messages):
        prompt: Any = tools.prompt_ids(service, histories.openai_history(messages), request)
    else:
        prompt = chat_messages(messages, "input")
    active = request if request is not None and request.active else None
    wanted = Wanted(prompt=prompt,
                    max_tokens=integer(body, "max_output_tokens", 1, MAX_TOKENS_LIMIT),
                    stream=typed(body, "stream", (bool,), "true or false", False),
                    drafts=typed(body, "drafts", (bool,), "true or false", True),
                    sampling=sampling_fields(body), tools=active,
                    constraint=constraint_from({}, tools.constraint_for(request,
                                                                        service.tokenizer)),
                    separate_reasoning=separate_reasoning(body))
    echoed = {"instructions": instructions, "previous_response_id": previous,
              "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
              "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False}
    return Request(wanted, conversation, active, echoed,
                   typed(body, "store", (bool,), "true or false", True))


class Reply:
    def __init__(self, service: Service, request: Request, prompt_ids: list[int],
                 store: ResponseStore) -> None:
        self.service, self.request, self.prompt_ids = service, request, prompt_ids
        self.wanted = request.wanted
        self.store = store
        key = uuid.uuid4().hex
        self.id = "resp_" + key
        self.output = OutputItems(request.tools, key, reasoning_splitters(
            service.tokenizer, prompt_ids, self.wanted.separate_reasoning))
        self.count_reasoning = reasoning_counter(service.tokenizer, prompt_ids)
        self.created = int(time.time())
        self.cached_tokens = 0  # prompt tokens taken from the prefix cache, once known
        self.sequence = 0  # the stream's next sequence_number

    def response(self, result: GenerationResult | None) -> dict[str, Any]:
        """The response object: in progress (no result yet) or finished (then kept for
        previous_response_id, unless the request said store: false)."""
        sampling = self.wanted.sampling
        body: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": "in_progress", "error": None, "incomplete_details": None,
            **self.request.echoed, "max_output_tokens": self.wanted.max_tokens,
            "model": self.service.model_name, "output": [], "store": self.request.store,
            "temperature": sampling.get("temperature"), "top_p": sampling.get("top_p"),
            "text": {"format": {"type": "text"}}, "truncation": "disabled", "usage": None,
            "metadata": {}}
        if result is None:
            return body
        incomplete = result.finish_reason in INCOMPLETE
        if not self.output.finished:  # a whole response: its items from the whole text
            self.output.feed(result.text or "", True, cut=incomplete)
        body["status"] = "incomplete" if incomplete else "completed"
        if incomplete:
            body["incomplete_details"] = {"reason": "max_output_tokens"}
        body["output"] = [dict(item) for item in self.output.items]
        prompt, output = len(self.prompt_ids), len(result.tokens)
        body["usage"] = {"input_tokens": prompt,
                         "input_tokens_details": {"cached_tokens": self.cached_tokens},
                         "output_tokens": output,
                         "output_tokens_details": {"reasoning_tokens": self.count_reasoning(
                             result.text, result.tokens)},
                         "total_tokens": prompt + output}
        body["receipt"] = self.service.receipt(result)
        if self.request.store:
            self.store.keep(self.id, [*self.request.conversation, self.output.as_message()])
        return body

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse(payload, kind)


async def _stream(call: Call, reply: Reply, submission: Submission) -> AsyncIterator[str]:
    try:
        yield reply.event("response.created", response=reply.response(None))
        yield reply.event("response.in_progress", response=reply.response(None))
        for kind, fields in reply.output.start():
            yield reply.event(kind, **fields)
        async for _, chunk in submission:
            call.seen(chunk)
            final = chunk.result is not None
            events = reply.output.feed(chunk.text or "", final,
                                       cut=final and chunk.result.finish_reason in INCOMPLETE)
            if final:  # counted before the last event
                call.count_submission(submission, len(reply.prompt_ids))
                call.finish(200)
                reply.cached_tokens = submission.cached_tokens[0]
            for kind, fields in events:
                yield reply.event(kind, **fields)
            if final:
                response = reply.response(chunk.result)
                done = "response.completed" if response["status"] == "completed" else \
                    "response.incomplete"
                yield reply.event(done, response=response)
    except Exception as error:
        call.finish(500)
        yield reply.event("error", code="api_error", message=stream_error(error)["message"],
                          param=None)
    finally:
        submission.cancel()
        if not call.finished:  # the client went away
            call.count_submission(submission, len(reply.prompt_ids))
            call.finish(200)
