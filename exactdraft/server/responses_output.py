"""The output items of a Responses API response, made from the model's text: one message item
or, with tools, a message item for each stretch of text and a `function_call` item for each
call, whole or as the stream's events.

Invariant: the stream's events assemble to the whole response's output for the same text:
every item is announced (`response.output_item.added`, status in_progress) before its deltas
and finished (`response.output_item.done`) after them with the very item the response's
`output` holds at that `output_index`; a message's `response.output_text.delta` events
concatenate to its text and a call's `response.function_call_arguments.delta` events to its
`arguments`. No text carries call markup but a broken call's; whitespace around calls is
dropped as the tool-call splitter drops it (server/tool_calls/formats.py). A call cut by the
length limit is dropped, as the chat APIs drop it: no function_call item whose arguments may
not parse. Where the template has reasoning (server/reasoning/), the reasoning is a
`reasoning` item before what follows it, its text a reasoning_text content part streamed as
`response.reasoning_text.delta` events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exactdraft.server.reasoning.formats import StreamedReasoning
from exactdraft.server.reasoning.pieces import Answer, Reasoning
from exactdraft.server.tool_calls.formats import CallArguments, CallEnd, CallStart, Content
from exactdraft.server.tool_calls.requests import ToolRequest

Event = tuple[str, dict[str, Any]]  # (type, fields other than type and sequence_number)


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


class OutputItems:
    """The items of one response as its text comes in; `key` makes the item and call ids."""

    def __init__(self, request: ToolRequest | None, key: str,
                 reasoning: Callable[[], Any] | None = None) -> None:
        self.splitter = None if request is None else request.splitter(f"call_{key}_")
        self.reasoner = None if reasoning is None else StreamedReasoning(reasoning)
        self.key = key
        self.items: list[dict[str, Any]] = []  # the output so far; the open item is the last
        self.open: dict[str, Any] | None = None
        self.started = self.finished = False
        self.events: list[Event] = []

    def start(self) -> list[Event]:
        """The events before any text: without tools or reasoning the one message opens at
        once."""
        self.started = True
        if self.splitter is None and self.reasoner is None:
            self._open_message()
        return self._take()

    def feed(self, text: str, final: bool, cut: bool = False) -> list[Event]:
        """The events for `text`, the next piece of the model's text (`final`: the last;
        `cut`: the length limit ended it)."""
        if not self.started:
            self.start()
        pieces = [Answer(text)] if self.reasoner is None else self.reasoner.pieces(text, final)
        for piece in pieces:
            if isinstance(piece, Reasoning):
                self._reasoning(piece.text)
            else:
                self._answer(piece.text)
        if self.splitter is not None and final:
            for event in self.splitter.finish(cut):
                self._event(event)
        if final:
            if not self.items:  # no text and no call: an empty message
                self._open_message()
            self._close()
            self.finished = True
        return self._take()

    def _answer(self, text: str) -> None:
        if self.splitter is not None:
            for event in self.splitter.feed(text):
                self._event(event)
            return
        if text and (self.open is None or self.open["type"] != "message"):
            self._close()
            self._open_message()
        self._text(text)

    def _reasoning(self, text: str) -> None:
        if self.open is None or self.open["type"] != "reasoning":
            self._close()
            self._add({"type": "reasoning", "id": f"rs_{self.key}_{len(self.items)}",
                       "summary": [], "content": [], "status": "in_progress"})
            self.open["text"] = ""  # the text so far; a part once the item is done
            self.events.append(("response.content_part.added",
                                {**self._where(True), "part": reasoning_part("")}))
        self.open["text"] += text
        self.events.append(("response.reasoning_text.delta",
                            {**self._where(True), "delta": text}))

    def _take(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    def _event(self, event: Any) -> None:
        if isinstance(event, Content):
            if self.open is None or self.open["type"] != "message":
                self._close()
                self._open_message()
            self._text(event.text)
        elif isinstance(event, CallStart):
            self._close()
            self._add({"type": "function_call", "id": f"fc_{self.key}_{len(self.items)}",
                       "call_id": event.id, "name": event.name, "arguments": "",
                       "status": "in_progress"})
        elif isinstance(event, CallArguments) and self.open is not None:
            self.open["arguments"] += event.text
            self.events.append(("response.function_call_arguments.delta",
                                {**self._where(), "delta": event.text}))
        elif isinstance(event, CallEnd) and self.open is not None:
            self.open["arguments"] = event.arguments
            self.open["status"] = "completed" if event.complete else "incomplete"
            self.events.append(("response.function_call_arguments.done",
                                {**self._where(), "arguments": event.arguments}))
            self._done()

    def _where(self, content: bool = False) -> dict[str, Any]:
        where = {"item_id": self.open["id"], "output_index": len(self.items) - 1}
        return {**where, "content_index": 0} if content else where

    def _add(self, item: dict[str, Any]) -> None:
        self.items.append(item)
        self.open = item
        self.events.append(("response.output_item.added",
                            {"output_index": len(self.items) - 1, "item": dict(item)}))

    def _open_message(self) -> None:
        number = len(self.items)
        self._add({"type": "message", "id": f"msg_{self.key}" + (f"_{number}" if number else ""),
                   "status": "in_progress", "role": "assistant", "content": []})
        self.open["text"] = ""  # the text so far; a part once the message is done
        self.events.append(("response.content_part.added",
                            {**self._where(True), "part": text_part("")}))

    def _text(self, text: str) -> None:
        if text:
            self.open["text"] += text
            self.events.append(("response.output_text.delta",
                                {**self._where(True), "delta": text, "logprobs": []}))

    def _close(self) -> None:
        """Finish the open item."""
        if self.open is None:
            return
        if self.open["type"] == "reasoning":
            text = self.open.pop("text")
            self.open["content"] = [reasoning_part(text)]
            where = self._where(True)
            self.events.append(("response.reasoning_text.done", {**where, "text": text}))
            self.events.append(("response.content_part.done",
                                {**where, "part": reasoning_part(text)}))
            self.open["status"] = "completed"
        elif self.open["type"] == "message":
            text = self.open.pop("text")
            self.open["content"] = [text_part(text)]
            where = self._where(True)
            self.events.append(("response.output_text.done",
                                {**where, "text": text, "logprobs": []}))
            self.events.append(("response.content_part.done", {**where, "part": text_part(text)}))
            self.open["status"] = "completed"
        elif self.open["status"] == "in_progress":  # the text ended inside the call
            self.open["status"] = "incomplete"
            self.events.append(("response.function_call_arguments.done",
                                {**self._where(), "arguments": self.open["arguments"]}))
        self._done()

    def _done(self) -> None:
        self.events.append(("response.output_item.done",
                            {"output_index": len(self.items) - 1, "item": dict(self.open)}))
        self.open = None

    def as_message(self) -> dict[str, Any]:
        """The output as the chat message a conversation continues from: the text and the
        complete calls (arguments as JSON text)."""
        text = "".join(part["text"] for item in self.items if item["type"] == "message"
                       for part in item["content"])
        calls = [{"id": item["call_id"], "type": "function",
                  "function": {"name": item["name"], "arguments": item["arguments"]}}
                 for item in self.items
                 if item["type"] == "function_call" and item["status"] == "completed"]
        reasoning = "".join(part["text"] for item in self.items if item["type"] == "reasoning"
                            for part in item["content"])
        return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {}),
                **({"reasoning_content": reasoning} if reasoning else {})}
