"""Tool calls in OpenAI's Harmony format (gpt-oss): a message to a function recipient on the
commentary channel, its arguments a JSON object, ended by <|call|>.

    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}
    <|call|>, or
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{..}<|call|>

Invariant (readers.py's): the reader acts only on text it has seen whole. The header (the
function name, the channel and the content type, up to <|message|>) is read once it is
complete; the arguments stream as the model writes them while JsonEnd tracks where the object
ends; the closing <|call|> is optional (it is a stop token, which the text may not carry). A
header that is not a function name followed by the channel or content type, or arguments that
are not a JSON object, raise ToolCallError naming the call. `call_grammar` is the constraint of
a call tool_choice forces, written as this reader reads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from exactdraft.constraints.constraint import COMPACT_JSON
from exactdraft.server.tool_calls.readers import (
    CallSink,
    JsonEnd,
    ToolCallError,
    _closing,
    arguments_object,
)

# Where a call starts: the assistant's header with a function recipient, in either place the
# format allows the recipient (the longest first, so no header markup reaches content).
MARKERS = ("<|start|>assistant<|channel|>commentary to=functions.",
           "<|channel|>commentary to=functions.", "<|start|>assistant to=functions.")
MESSAGE, CALL = "<|message|>", "<|call|>"
HEADER_LIMIT = 256  # characters between a marker and <|message|>
_HEADER = re.compile(r"([A-Za-z0-9_\-.]+)(?:\s*<\|channel\|>\s*commentary)?"
                     r"\s*(?:<\|constrain\|>\s*)?(?:json)?\s*")


def detect(source: str) -> bool:
    """Whether a chat template renders Harmony turns and calls."""
    return "<|channel|>" in source and CALL in source


class HarmonyCallReader:
    def __init__(self, sink: CallSink) -> None:
        self.sink = sink
        self.index: int | None = None
        self.name = ""
        self.arguments = ""
        self.arguments_end: JsonEnd | None = None
        self.called = False

    def _what(self) -> str:
        return f"tool call {self.index} ({self.name})"

    def feed(self, pending: str, final: bool) -> tuple[int, bool]:
        used = 0
        if self.index is None:
            # Only a <|message|> within HEADER_LIMIT counts, whole or streamed alike.
            opened = pending.find(MESSAGE, 0, HEADER_LIMIT + len(MESSAGE))
            if opened < 0:
                if len(pending) >= HEADER_LIMIT + len(MESSAGE):
                    raise ToolCallError(f"a Harmony tool call's header has no {MESSAGE} within "
                                        f"{HEADER_LIMIT} characters: {pending[:60]!r}")
                return (len(pending), True) if final else (0, False)
            header = _HEADER.fullmatch(pending[:opened])
            if header is None:
                raise ToolCallError(f"a Harmony tool call's header is not a function name, "
                                    f"channel and content type: {pending[:opened][:60]!r}")
            self.name = header.group(1)
            self.index = self.sink.start(self.name)
            self.arguments_end = JsonEnd(self._what())
            used = opened + len(MESSAGE)
        if not self.called:
            piece = pending[used:]
            stop = self.arguments_end.feed(piece)
            piece = piece if stop is None else piece[:stop]
            if piece:
                self.sink.arguments(self.index, piece)
            self.arguments += piece
            used += len(piece)
            if stop is None:
                if final:  # the text ended inside the arguments
                    self.sink.end(self.index, self.arguments, False)
                    return len(pending), True
                return used, False
            arguments_object(self.arguments, self._what())
            self.sink.end(self.index, self.arguments, True)
            self.called = True
        taken = _closing(pending[used:], CALL, final, self._what())
        return (used, False) if taken is None else (used + taken, True)


# -- the constraint of a forced call ------------------------------------------------------

def call_grammar(functions: Sequence[Mapping[str, Any]], choice: str,
                 parallel: bool) -> str | None:
    """The Lark grammar (llguidance's dialect) of the calls tool_choice `choice` forces in
    Harmony ("required": one call to any function, several with `parallel`; a function's
    name: one call to it), or None for "auto" and "none" (free output). The reply may reason
    first, in one analysis message; each call is a commentary message to functions.NAME with
    compact JSON arguments (unless the schema says otherwise), ended by <|call|>. The
    generation prompt ends with <|start|>assistant, so the first message has no role header
    and a later call starts with one."""
    if choice in ("auto", "none"):
        return None
    chosen = list(functions) if choice == "required" else \
        [f for f in functions if f["name"] == choice]
    if not chosen:
        raise ToolCallError(f"tool_choice names {choice!r}, which is not one of the tools")
    rules = []
    for index, function in enumerate(chosen):
        schema = dict(function.get("parameters") or {"type": "object"})
        schema.setdefault("x-guidance", COMPACT_JSON)
        head = f"<|channel|>commentary to=functions.{function['name']} <|constrain|>json" \
            + MESSAGE
        rules.append(f"call_{index}: {json.dumps(head)} %json {json.dumps(schema)} "
                     f"{json.dumps(CALL)}")
    more = f' ({json.dumps("<|start|>assistant")} call)*' if parallel else ""
    return "\n".join([
        f"start: analysis? call{more}",
        "call: " + " | ".join(f"call_{i}" for i in range(len(chosen))),
        f'analysis: {json.dumps("<|channel|>analysis" + MESSAGE)} thought '
        f'{json.dumps("<|start|>assistant")}',
        r"thought[lazy]: /(?s:.*)<\|end\|>/", *rules]) + "\n"
