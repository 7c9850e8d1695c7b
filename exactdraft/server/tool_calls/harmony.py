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
a call tool_choice forces, written as this reader reads it: the markers as the special tokens
they are in gpt-oss's tokenizer where the model's tokenizer has them so (their text is what the
reader reads, the server decoding special tokens into the text), as text otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from exactdraft.constraints.constraint import COMPACT_JSON
from exactdraft.constraints.once import OncePer, once_per
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

# The markers a forced call's grammar writes; gpt-oss's tokenizer (o200k_harmony) has each as a
# special token, which a grammar allows only by naming it (constraints/special_tokens.py).
SPECIAL_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>",
                   "<|call|>")
# Where a reasoning body ends in the text the splitter reads (reasoning/harmony.py's ENDS).
_BODY_ENDS = r"<\|end\|>|<\|return\|>|<\|call\|>"


def markers_are_special(tokenizer: Any) -> bool:
    """Whether `tokenizer` (an exactdraft Tokenizer) has every Harmony marker as a special
    token, as gpt-oss's has: a forced call's grammar then names them as tokens. Found once
    per tokenizer (its added-token table is read the first time only)."""
    return once_per(tokenizer, _MARKERS_SPECIAL, lambda: _reads_markers_as_special(tokenizer))


_MARKERS_SPECIAL = OncePer()  # tokenizer -> markers_are_special


def _reads_markers_as_special(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend", None)
    if backend is None or not hasattr(backend, "get_added_tokens_decoder"):
        return False
    special = {token.content for token in backend.get_added_tokens_decoder().values()
               if token.special}
    return all(marker in special for marker in SPECIAL_MARKERS)


def call_grammar(functions: Sequence[Mapping[str, Any]], choice: str,
                 parallel: bool, special_markers: bool = False) -> str | None:
    """The Lark grammar (llguidance's dialect) of the calls tool_choice `choice` forces in
    Harmony ("required": one call to any function, several with `parallel` where the markers
    are text; a function's name: one call to it), or None for "auto" and "none" (free
    output). The reply may reason first, in one analysis message; each call is a commentary
    message to functions.NAME with compact JSON arguments (unless the schema says otherwise),
    ended by <|call|>. The generation prompt ends with <|start|>assistant, so the first
    message has no role header and a later call starts with one.

    `special_markers`: the tokenizer has the markers as special tokens (markers_are_special):
    the grammar names them as tokens (build it with Constraint.grammar(..., special_tokens=
    SPECIAL_MARKERS)), and its last <|call|> is optional, for <|call|> is then a stop token,
    allowed where the grammar may end; the reply ends at its first <|call|>, so that form has
    one call per reply, `parallel` or not. Otherwise the markers are text."""
    if choice in ("auto", "none"):
        return None
    chosen = list(functions) if choice == "required" else \
        [f for f in functions if f["name"] == choice]
    if not chosen:
        raise ToolCallError(f"tool_choice names {choice!r}, which is not one of the tools")
    if special_markers:
        return _special_grammar(chosen)
    rules = []
    for index, function in enumerate(chosen):
        head = f"<|channel|>commentary to=functions.{function['name']} <|constrain|>json" \
            + MESSAGE
        rules.append(f"call_{index}: {json.dumps(head)} %json {_arguments(function)} "
                     f"{json.dumps(CALL)}")
    more = f' ({json.dumps("<|start|>assistant")} call)*' if parallel else ""
    return "\n".join([
        f"start: analysis? call{more}",
        "call: " + " | ".join(f"call_{i}" for i in range(len(chosen))),
        f'analysis: {json.dumps("<|channel|>analysis" + MESSAGE)} thought '
        f'{json.dumps("<|start|>assistant")}',
        r"thought[lazy]: /(?s:.*)<\|end\|>/", *rules]) + "\n"


def _special_grammar(chosen: Sequence[Mapping[str, Any]]) -> str:
    """call_grammar's call with the markers named as special tokens: one call, since
    <|call|> is a stop token that ends the reply (a call after it could never be written).
    The reasoning is text holding no body end written as text, so the splitter ends it where
    the token ends it."""
    rules = []
    for index, function in enumerate(chosen):
        recipient = json.dumps(f"commentary to=functions.{function['name']} ")
        rules.append(f'call_{index}: <|channel|> {recipient} <|constrain|> "json" <|message|> '
                     f"%json {_arguments(function)}")
    return "\n".join([
        "start: analysis? call <|call|>?",
        "call: " + " | ".join(f"call_{i}" for i in range(len(chosen))),
        'analysis: <|channel|> "analysis" <|message|> THOUGHT <|end|> <|start|> "assistant"',
        f"THOUGHT: /(?s:.*)/ & ~/(?s:.*)({_BODY_ENDS})(?s:.*)/", *rules]) + "\n"


def _arguments(function: Mapping[str, Any]) -> str:
    """The JSON schema of a function's arguments as the grammar holds it (compact JSON unless
    the schema says otherwise)."""
    schema = dict(function.get("parameters") or {"type": "object"})
    schema.setdefault("x-guidance", COMPACT_JSON)
    return json.dumps(schema)
