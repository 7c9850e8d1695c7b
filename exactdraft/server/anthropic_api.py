"""The Anthropic wire format: /v1/messages, whole or as its stream of events.

Invariant: a message (whole or streamed) carries exactly what the engine committed: the text, the
stop reason (end_turn for a stop token, stop_sequence with the string that matched, max_tokens for
the length or context limit), the token counts and, as exactdraft's extension, the receipt (in the
message, and in the stream's message_delta event). Streamed text deltas concatenate to the whole
message's text; with tools (server/tool_calls/requests.py) the call markup comes out as `tool_use`
blocks instead, whole or streamed alike; where the chat template has reasoning
(server/reasoning/), the reasoning is a `thinking` block before what follows it, and the whole
message is built from the same events its stream sends. Each thinking block is signed under the
server's key (server/reasoning/signatures.py): a thinking block given back that this server
signed and that was changed since is refused, naming the message and block; one without a
signature, or with another server's or Anthropic's, is read as it is and a `redacted_thinking`
block is dropped. Extensions in a request: `min_p`,
`repetition_penalty`, `seed`, `drafts` (false: serial decoding) and `separate_reasoning` (false:
the reasoning stays in the text as written).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import exactdraft.server.tool_calls.histories as histories
import exactdraft.server.tool_calls.replies as tool_replies
import exactdraft.server.tool_calls.requests as tools
from exactdraft.decoding import Chunk, GenerationResult
from exactdraft.server.fields import (
    MAX_TOKENS_LIMIT,
    RequestError,
    Wanted,
    chat_messages,
    constraint_from,
    integer,
    refuse_unsupported,
    sampling_fields,
    separate_reasoning,
    stop_strings,
    text_content,
    typed,
)
from exactdraft.server.reasoning.formats import StreamedReasoning, reasoning_splitters
from exactdraft.server.reasoning.pieces import Reasoning
from exactdraft.server.reasoning.signatures import sign, was_changed
from exactdraft.server.service import Service

UNSUPPORTED = ("mcp_servers", "container")


def messages_request(body: Mapping[str, Any], service: Service) -> Wanted:
    refuse_unsupported(body, UNSUPPORTED)
    service.check_model(dict(body))
    if body.get("max_tokens") is None:
        raise RequestError("max_tokens is required", "max_tokens")
    max_tokens = integer(body, "max_tokens", 1, MAX_TOKENS_LIMIT)  # the context: Service
    system = body.get("system")
    # `system` as a string or text blocks; system entries inside `messages` (which some
    # clients send) join it, in order, as the one system prompt a chat template takes.
    systems = [] if system is None else [text_content(system, "system")]
    conversation = body.get("messages")
    if isinstance(conversation, list):
        for index, message in enumerate(conversation):
            if not isinstance(message, dict) or message.get("role") == "system":
                continue
            if message.get("role") not in ("user", "assistant"):
                raise RequestError(f"messages[{index}].role must be user, assistant or system",
                                   f"messages[{index}].role")
        systems += [text_content(m.get("content"), f"messages[{i}].content")
                    for i, m in enumerate(conversation)
                    if isinstance(m, dict) and m.get("role") == "system"]
        conversation = [m for m in conversation
                        if not (isinstance(m, dict) and m.get("role") == "system")]
    system_text = "\n\n".join(text for text in systems if text) or None
    conversation = thinking_apart(conversation, service.thinking_key)
    request = tools.anthropic_tools(body, getattr(service.tokenizer, "chat_template", None))
    if request is not None or histories.uses_tools(conversation):
        prompt: Any = tools.prompt_ids(
            service, histories.anthropic_history(conversation, system_text), request)
    else:
        prompt = chat_messages(conversation, system=system_text)
    return Wanted(prompt=prompt, max_tokens=max_tokens,
                  tools=request if request is not None and request.active else None,
                  constraint=constraint_from(body, tools.constraint_for(request,
                                                                        service.tokenizer)),
                  stream=typed(body, "stream", (bool,), "true or false", False),
                  stop=stop_strings(body, "stop_sequences"),
                  drafts=typed(body, "drafts", (bool,), "true or false", True),
                  sampling=sampling_fields(body), separate_reasoning=separate_reasoning(body))


def thinking_apart(conversation: Any, key: bytes) -> Any:
    """The messages with each assistant message's thinking blocks taken out of its content
    and given as its `reasoning_content` (their texts joined; redacted thinking has none), for
    the chat template to render or drop as it does. A block this server signed under `key`
    must be unchanged (a RequestError naming the block otherwise; signatures.was_changed)."""
    if not isinstance(conversation, list):
        return conversation
    apart = []
    for index, message in enumerate(conversation):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or message.get("role") != "assistant":
            apart.append(message)
            continue
        thoughts, kept = [], []
        for number, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "thinking":
                where = f"messages[{index}].content[{number}].thinking"
                if not isinstance(block.get("thinking"), str):
                    raise RequestError(f"{where} must be a string", where)
                check_signature(block, key, f"messages[{index}].content[{number}]")
                thoughts.append(block["thinking"])
            elif kind != "redacted_thinking":
                kept.append(block)
        given = {"reasoning_content": "".join(thoughts)} if thoughts else {}
        apart.append({**message, "content": kept, **given})
    return apart


def check_signature(block: Mapping[str, Any], key: bytes, where: str) -> None:
    """A given-back thinking block signed under `key` is unchanged; a block without a
    signature (none, null or empty: a history written by hand) or with another server's or
    another API's passes, read as unsigned."""
    signature = block.get("signature")
    if signature in (None, ""):
        return
    if not isinstance(signature, str):
        raise RequestError(f"{where}.signature must be a string", f"{where}.signature")
    if was_changed(key, block["thinking"], signature):
        raise RequestError(f"{where}: invalid signature in thinking block: this server "
                           "signed the block and it was changed since", f"{where}.signature")


class Reply:
    def __init__(self, service: Service, wanted: Wanted, prompt_ids: list[int]) -> None:
        self.service, self.wanted, self.prompt_ids = service, wanted, prompt_ids
        self.id = "msg_" + uuid.uuid4().hex
        self.cached_tokens = 0  # prompt tokens taken from the prefix cache, once known
        self.call_prefix = f"toolu_{self.id[-24:]}_"
        self.blocks = None if wanted.tools is None else \
            tool_replies.AnthropicBlocks(wanted.tools, self.call_prefix)
        # A reply's reasoning is its thinking blocks (server/reasoning/) where the template
        # has one; the blocks then open as the text comes, with tools or without.
        make_splitter = reasoning_splitters(service.tokenizer, prompt_ids,
                                            wanted.separate_reasoning)
        self.reasoner = None
        if make_splitter is not None:
            self.reasoner = StreamedReasoning(make_splitter)
            key = service.thinking_key
            self.blocks = tool_replies.AnthropicBlocks(wanted.tools, self.call_prefix,
                                                       lambda thought: sign(key, thought))

    def _tool_stop(self, reason: str, called: bool) -> str:
        return "tool_use" if called and reason == "end_turn" else reason

    def _stop(self, result: GenerationResult) -> tuple[str, str | None]:
        if result.finish_reason == "stop":
            if isinstance(result.stop, str):
                return "stop_sequence", result.stop
            return "end_turn", None
        return ("max_tokens", None) \
            if result.finish_reason in ("length", "context", "incomplete") else \
            ("end_turn", None)

    def _message(self, content: list[dict[str, Any]], output_tokens: int) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "content": content,
                "model": self.service.model_name, "stop_reason": None, "stop_sequence": None,
                "usage": self.usage(output_tokens)}

    def usage(self, output_tokens: int) -> dict[str, int]:
        """Anthropic's split: input_tokens excludes the prompt tokens read from the cache
        (cache_read_input_tokens); their sum is the whole prompt, what count_tokens counts."""
        return {"input_tokens": len(self.prompt_ids) - self.cached_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": self.cached_tokens, "output_tokens": output_tokens}

    def whole(self, results: list[GenerationResult]) -> dict[str, Any]:
        result = results[0]
        if self.reasoner is not None:  # the blocks its stream builds
            blocks = tool_replies.assembled_blocks(self.block_events(
                result.text or "", True, result.finish_reason in tool_replies.CUT))
        elif self.wanted.tools is not None:
            blocks = tool_replies.anthropic_blocks(self.wanted.tools, result.text or "",
                                                   self.call_prefix,
                                                   result.finish_reason in tool_replies.CUT)
        else:
            blocks = [{"type": "text", "text": result.text or ""}]
        message = self._message(blocks, len(result.tokens))
        reason, message["stop_sequence"] = self._stop(result)
        message["stop_reason"] = self._tool_stop(
            reason, any(b["type"] == "tool_use" for b in blocks))
        message["receipt"] = self.service.receipt(result)
        return message

    def start_events(self) -> list[tuple[str, dict[str, Any]]]:
        if self.blocks is not None:  # with tools, blocks open as text and calls come
            return [("message_start", {"type": "message_start", "message": self._message([], 0)}),
                    ("ping", {"type": "ping"})]
        return [("message_start", {"type": "message_start", "message": self._message([], 0)}),
                ("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}}),
                ("ping", {"type": "ping"})]

    def block_events(self, text: str, final: bool, cut: bool) -> list[tuple[str, dict[str, Any]]]:
        """The content-block events of the next piece of text (with tools or reasoning)."""
        if self.reasoner is None:
            return self.blocks.events(text, final, cut)
        events = []
        for piece in self.reasoner.pieces(text, final):
            events += self.blocks.thinking(piece.text) if isinstance(piece, Reasoning) else \
                self.blocks.events(piece.text, False)
        return events + (self.blocks.events("", True, cut) if final else [])

    def chunk_events(self, chunk: Chunk) -> list[tuple[str, dict[str, Any]]]:
        events = []
        if self.blocks is not None:
            result = chunk.result
            events += self.block_events(chunk.text, result is not None,
                                        result is not None and
                                        result.finish_reason in tool_replies.CUT)
        elif chunk.text:
            events.append(("content_block_delta", {
                "type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": chunk.text}}))
        result = chunk.result
        if result is not None:
            reason, sequence = self._stop(result)
            if self.blocks is None:
                events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
            else:
                reason = self._tool_stop(reason, self.blocks.called)
            events += [("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": reason,
                                                    "stop_sequence": sequence},
                                          "usage": {"output_tokens": len(result.tokens)},
                                          "receipt": self.service.receipt(result)}),
                       ("message_stop", {"type": "message_stop"})]
        return events
