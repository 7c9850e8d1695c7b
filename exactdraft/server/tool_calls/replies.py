"""Tool calls in responses: OpenAI messages and stream deltas, Anthropic content blocks and
stream events, made from the model's text by the request's tool-call splitter.

Invariant: a streamed response assembles to the whole response for the same text: the content
deltas concatenate to the message's content, each call's first delta carries its index, id and
name and the argument deltas concatenate to its arguments (OpenAI `tool_calls`, Anthropic
`input_json_delta` of a `tool_use` block), and no text delta carries call markup but a broken
call's (one that does not parse: content as written, with the text after it; formats.py). A
call is sent once it is complete and its markup ends (its deltas come together; a list's calls
together); a call the text ends inside (cut by max_tokens or a stop token) is neither a call
nor content, whole or streamed, so every call a response holds has arguments that parse, and
the response goes back into a history as it is. A thinking block ends with a `signature_delta`
carrying its signature (server/reasoning/signatures.py) before it stops.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from exactdraft.server.tool_calls.formats import CallArguments, CallEnd, CallStart, Content, collect
from exactdraft.server.tool_calls.requests import ToolRequest

# Finish reasons of a text cut short by the length limit (max_tokens or the context).
CUT = ("length", "context", "incomplete")


def openai_message(request: ToolRequest, text: str, id_prefix: str,
                   cut: bool = False) -> dict[str, Any]:
    """A whole chat message for a model text: content and tool_calls (content null when the
    text was only calls). `cut`: the text was cut by the length limit."""
    content, calls = parse(request, text, id_prefix, cut)
    message: dict[str, Any] = {"role": "assistant",
                               "content": None if calls and not content.strip() else content}
    if calls:
        message["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in calls]
    return message


def parse(request: ToolRequest, text: str, id_prefix: str,
          cut: bool = False) -> tuple[str, list[Any]]:
    splitter = request.splitter(id_prefix)
    return collect(splitter.feed(text) + splitter.finish(cut))


def openai_delta(events: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    """(content, tool_calls) of one streamed delta: a call's first entry carries its index,
    id, type and name, later ones (and the rest of the first) its argument text."""
    content, entries = [], {}
    for event in events:
        if isinstance(event, Content):
            content.append(event.text)
        elif isinstance(event, CallStart):
            entries[event.index] = {"index": event.index, "id": event.id, "type": "function",
                                    "function": {"name": event.name, "arguments": ""}}
        elif isinstance(event, CallArguments):
            entry = entries.setdefault(event.index, {"index": event.index,
                                                     "function": {"arguments": ""}})
            entry["function"]["arguments"] += event.text
    return "".join(content), list(entries.values())


def anthropic_blocks(request: ToolRequest, text: str, id_prefix: str,
                     cut: bool = False) -> list[dict[str, Any]]:
    """The content blocks of a whole message: the text (when there is any, or no call) and a
    tool_use block per complete call."""
    content, calls = parse(request, text, id_prefix, cut)
    blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] \
        if content or not calls else []
    for call in calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name,
                       "input": json.loads(call.arguments)})
    return blocks


class AnthropicBlocks:
    """The content-block events of a streamed message with tools: a text block opens when
    text comes and closes when a call starts; each call is a tool_use block whose input
    streams as input_json_delta events. Without a request (no tools) the text is all text
    blocks; `thinking` opens a thinking block for reasoning (server/reasoning/), which
    `sign` (its text -> its signature) signs as it stops."""

    def __init__(self, request: ToolRequest | None, id_prefix: str,
                 sign: Callable[[str], str] | None = None) -> None:
        self.splitter = None if request is None else request.splitter(id_prefix)
        self.open: str | None = None  # the kind of the open block
        self.count = 0  # blocks started
        self.called = False
        self.sign = sign
        self.thought = ""  # the open thinking block's text so far

    def _stop(self) -> list[tuple[str, dict[str, Any]]]:
        if self.open is None:
            return []
        events = []
        if self.open == "thinking" and self.sign is not None:
            events.append(("content_block_delta", {
                "type": "content_block_delta", "index": self.count - 1,
                "delta": {"type": "signature_delta", "signature": self.sign(self.thought)}}))
        self.open, self.thought = None, ""
        return events + [("content_block_stop", {"type": "content_block_stop",
                                                 "index": self.count - 1})]

    def _start(self, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        events = self._stop()
        self.open, self.count = block["type"], self.count + 1
        return events + [("content_block_start", {"type": "content_block_start",
                                                  "index": self.count - 1,
                                                  "content_block": block})]

    def events(self, text: str, final: bool, cut: bool = False) -> list[tuple[str, dict[str, Any]]]:
        """The events of the next piece of text (`final`: the last, `cut` by the length
        limit)."""
        out: list[tuple[str, dict[str, Any]]] = []
        if self.splitter is None:
            found: list[Any] = [Content(text)] if text else []
        else:
            found = self.splitter.feed(text) + (self.splitter.finish(cut) if final else [])
        for event in found:
            if isinstance(event, Content):
                if self.open != "text":
                    out += self._start({"type": "text", "text": ""})
                out.append(("content_block_delta", {
                    "type": "content_block_delta", "index": self.count - 1,
                    "delta": {"type": "text_delta", "text": event.text}}))
            elif isinstance(event, CallStart):
                self.called = True
                out += self._start({"type": "tool_use", "id": event.id, "name": event.name,
                                    "input": {}})
            elif isinstance(event, CallArguments):
                out.append(("content_block_delta", {
                    "type": "content_block_delta", "index": self.count - 1,
                    "delta": {"type": "input_json_delta", "partial_json": event.text}}))
            elif isinstance(event, CallEnd):
                out += self._stop()
        if final:
            if self.count == 0:
                out += self._start({"type": "text", "text": ""})
            out += self._stop()
        return out

    def thinking(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        """The events of a piece of reasoning: a thinking block's delta (the block opens
        first unless it is open)."""
        out = [] if self.open == "thinking" else \
            self._start({"type": "thinking", "thinking": "", "signature": ""})
        self.thought += text
        return out + [("content_block_delta", {
            "type": "content_block_delta", "index": self.count - 1,
            "delta": {"type": "thinking_delta", "thinking": text}})]


def assembled_blocks(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The content blocks a message's stream of block events builds (what a client that
    reads the stream holds at its end): text and thinking deltas joined, a signature delta
    setting the block's signature, input JSON parsed."""
    blocks: list[dict[str, Any]] = []
    inputs: dict[int, str] = {}
    for kind, payload in events:
        if kind == "content_block_start":
            blocks.append(dict(payload["content_block"]))
        elif kind == "content_block_delta":
            delta, index = payload["delta"], payload["index"]
            if delta["type"] == "text_delta":
                blocks[index]["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                blocks[index]["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                blocks[index]["signature"] = delta["signature"]
            else:
                inputs[index] = inputs.get(index, "") + delta["partial_json"]
    for index, text in inputs.items():
        blocks[index]["input"] = json.loads(text)
    return blocks
