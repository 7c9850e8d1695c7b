"""The OpenAI wire format: /v1/chat/completions, /v1/completions and /v1/models.

Invariant: a response (whole or streamed) carries exactly what the engine committed for each
choice: its text, its finish reason, its logprobs (the token, its logprob and the top
alternatives from the distribution the draw was made from) and its receipt; a streamed choice's
deltas concatenate to the whole response's text. Fields beyond OpenAI's are exactdraft's
extensions: `top_k`, `min_p`, `repetition_penalty` and `drafts` (false: serial decoding) in a
request, `receipt` on each finished choice. With tools (server/tool_calls/requests.py), the
call markup in a choice's text comes out as its `tool_calls` instead of content, whole or
streamed alike. Where the chat template has reasoning (server/reasoning/), a chat choice's
reasoning is its message's `reasoning_content` (streamed as `delta.reasoning_content`) and the
content is the answer only, unless the request sends the extension `separate_reasoning: false`.
A chat response's usage counts the generated tokens of the reasoning, markup included, in
`completion_tokens_details.reasoning_tokens` (server/reasoning/usage.py), whole and streamed
alike.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import exactdraft.server.tool_calls.histories as histories
import exactdraft.server.tool_calls.replies as tool_replies
import exactdraft.server.tool_calls.requests as tools
from exactdraft.decoding import Chunk, GenerationResult
from exactdraft.sampling.keyed import TokenLogprob
from exactdraft.server.fields import (
    MAX_TOKENS_LIMIT,
    OPENAI_SAMPLING,
    RequestError,
    Wanted,
    chat_messages,
    constraint_from,
    integer,
    refuse_unsupported,
    sampling_fields,
    separate_reasoning,
    stop_strings,
    top_logprobs,
    typed,
)
from exactdraft.server.reasoning.formats import (
    StreamedReasoning,
    reasoning_splitters,
    split_whole,
)
from exactdraft.server.reasoning.usage import reasoning_counter
from exactdraft.server.service import Service

# `prediction` (predicted output) is accepted and ignored: it could change speed only.
UNSUPPORTED = ("functions", "function_call", "audio", "suffix")
FINISH = {"stop": "stop", "length": "length", "context": "length", "interrupted": "stop",
          "incomplete": "length", "unsatisfiable": "stop"}


def common(body: Mapping[str, Any], service: Service, prompt: Any) -> Wanted:
    refuse_unsupported(body, UNSUPPORTED)
    service.check_model(dict(body))
    max_tokens = integer(body, "max_completion_tokens", 0, MAX_TOKENS_LIMIT)
    if max_tokens is None:  # whether it fits the context is the Service's to say
        max_tokens = integer(body, "max_tokens", 0, MAX_TOKENS_LIMIT)
    options = typed(body, "stream_options", (dict,), "an object", {})
    return Wanted(prompt=prompt, max_tokens=max_tokens,
                  n=integer(body, "n", 1, 64, 1),
                  stream=typed(body, "stream", (bool,), "true or false", False),
                  stop=stop_strings(body, "stop"),
                  drafts=typed(body, "drafts", (bool,), "true or false", True),
                  sampling=sampling_fields(body, OPENAI_SAMPLING),
                  include_usage=bool(options.get("include_usage")))


def chat_request(body: Mapping[str, Any], service: Service) -> Wanted:
    wanted = common(body, service, None)
    request = tools.openai_tools(body, getattr(service.tokenizer, "chat_template", None))
    if request is not None or histories.uses_tools(body.get("messages")):
        wanted.prompt = tools.prompt_ids(service, histories.openai_history(body.get("messages")),
                                         request)
        wanted.tools = request if request is not None and request.active else None
    else:
        wanted.prompt = chat_messages(body.get("messages"))
    wanted.constraint = constraint_from(body, tools.constraint_for(request, service.tokenizer))
    wanted.separate_reasoning = separate_reasoning(body)
    if typed(body, "logprobs", (bool,), "true or false", False):
        wanted.logprobs = top_logprobs(body, "top_logprobs")
    elif body.get("top_logprobs") is not None:
        raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
    return wanted


class Reply:
    """One response in the making: chat or completion, whole or streamed."""

    def __init__(self, service: Service, chat: bool, wanted: Wanted, prompt_ids: list[int]):
        self.service, self.chat, self.wanted = service, chat, wanted
        self.prompt_ids = prompt_ids
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.cached_tokens = 0  # prompt tokens taken from the prefix cache, once known
        self.splitters: dict[int, Any] = {}  # choice -> tool-call splitter, when streaming
        self.called: set[int] = set()  # choices that made tool calls
        # A chat reply's reasoning goes apart (server/reasoning/) where the template has one.
        self.make_reasoning_splitter = reasoning_splitters(
            service.tokenizer, prompt_ids, wanted.separate_reasoning) if chat else None
        self.reasoners: dict[int, StreamedReasoning] = {}  # choice -> splitter, streaming
        self.count_reasoning = reasoning_counter(service.tokenizer, prompt_ids) if chat else None
        self.reasoning_tokens: dict[int, int] = {}  # choice -> its count, once it finished

    def _call_prefix(self, index: int) -> str:
        return f"call_{self.id[-24:]}_{index}_"

    def _finish(self, index: int, result: GenerationResult) -> str:
        reason = FINISH[result.finish_reason]
        return "tool_calls" if reason == "stop" and index in self.called else reason

    def head(self) -> dict[str, Any]:
        """The fields every response of this reply starts with."""
        return self._head(self.object)

    def _head(self, object_name: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created,
                "model": self.service.model_name, "system_fingerprint": None}

    def _usage(self, completion: int) -> dict[str, Any]:
        prompt = len(self.prompt_ids)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion,
                 "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}
        if self.chat:
            usage["completion_tokens_details"] = {
                "reasoning_tokens": sum(self.reasoning_tokens.values())}
        return usage

    def _count_reasoning(self, index: int, result: GenerationResult) -> None:
        if self.count_reasoning is not None:
            self.reasoning_tokens[index] = self.count_reasoning(result.text, result.tokens)

    def whole(self, results: list[GenerationResult]) -> dict[str, Any]:
        choices = []
        for index, result in enumerate(results):
            choice: dict[str, Any] = {"index": index}
            text, reasoning = result.text or "", ""
            if self.make_reasoning_splitter is not None:
                reasoning, text = split_whole(self.make_reasoning_splitter(), text)
            if self.chat and self.wanted.tools is not None:
                choice["message"] = tool_replies.openai_message(
                    self.wanted.tools, text, self._call_prefix(index),
                    result.finish_reason in tool_replies.CUT)
                if choice["message"].get("tool_calls"):
                    self.called.add(index)
            elif self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = result.text or ""
            if self.make_reasoning_splitter is not None:
                choice["message"]["reasoning_content"] = reasoning or None
            choice["finish_reason"] = self._finish(index, result)
            choice["logprobs"] = self.logprobs(result.logprobs, 0)
            self._count_reasoning(index, result)
            choice["receipt"] = self.service.receipt(result)
            choices.append(choice)
        return {**self._head(self.object), "choices": choices,
                "usage": self._usage(sum(len(r.tokens) for r in results))}

    def chunk(self, index: int, chunk: Chunk, first: bool, offset: int) -> dict[str, Any]:
        """The SSE payload of one engine chunk; `offset`: the choice's text so far."""
        choice: dict[str, Any] = {"index": index, "logprobs": self.logprobs(chunk.logprobs,
                                                                            offset)}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            text = chunk.text
            if self.make_reasoning_splitter is not None:
                if index not in self.reasoners:
                    self.reasoners[index] = StreamedReasoning(
                        self.make_reasoning_splitter)
                reasoning, text = self.reasoners[index].split(text, chunk.result is not None)
                if reasoning:
                    delta["reasoning_content"] = reasoning
            if self.wanted.tools is not None:  # calls come out of the text as tool_calls
                if index not in self.splitters:
                    self.splitters[index] = self.wanted.tools.splitter(self._call_prefix(index))
                splitter = self.splitters[index]
                events = splitter.feed(text) + ([] if chunk.result is None else splitter.finish(
                    chunk.result.finish_reason in tool_replies.CUT))
                text, calls = tool_replies.openai_delta(events)
                if calls:
                    delta["tool_calls"] = calls
                    self.called.add(index)
            if text or first:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = chunk.text
        result = chunk.result
        choice["finish_reason"] = None if result is None else self._finish(index, result)
        if result is not None:
            choice["receipt"] = self.service.receipt(result)
            if self.wanted.include_usage:  # the count is read by the usage chunk only
                self._count_reasoning(index, result)
        name = "chat.completion.chunk" if self.chat else "text_completion"
        payload = {**self._head(name), "choices": [choice]}
        if self.wanted.include_usage:
            payload["usage"] = None
        return payload

    def usage_chunk(self, completion: int) -> dict[str, Any]:
        name = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(name), "choices": [], "usage": self._usage(completion)}

    def logprobs(self, entries: list[TokenLogprob] | None, offset: int) -> Any:
        if entries is None:
            return None
        piece = self.service.piece
        if self.chat:
            def item(token: int, logprob: float) -> dict[str, Any]:
                text = piece(token)
                return {"token": text, "logprob": logprob, "bytes": list(text.encode()),
                        "token_id": token}

            return {"content": [{**item(e.token, e.logprob),
                                 "top_logprobs": [item(t, lp) for t, lp in e.top]}
                                for e in entries]}
        tokens, offsets = [], []
        for entry in entries:
            offsets.append(offset)
            tokens.append(piece(entry.token))
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{piece(t): lp for t, lp in e.top} for e in entries],
                "text_offset": offsets}


def models(service: Service) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                        "owned_by": "exactdraft"}
                                       for name in service.model_names]}
