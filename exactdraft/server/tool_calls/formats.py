"""Tool calls in model text: one table row per markup format, and a streaming splitter that
turns text deltas into content deltas and tool-call events.

Invariant: what the splitter emits depends only on the text, not on how the text was cut into
deltas: feeding a text whole or in any pieces gives the same content (concatenated), the same
calls in the same order with the same names, and argument deltas that concatenate to the same
arguments string. Raw call markup never reaches content (but a broken call's, below): text
that could still be the start of
a start marker is held back (as exactdraft/stops.py holds back stop strings) until it is
settled. Whitespace between content and a call is dropped with the call's markup (a text with
no calls comes out whole). A call's events are held back until the call is complete and its
markup read to its end (or the text ends inside the markup), so a call that never completes
(the text ends inside it) is never emitted, whole or streamed; a text cut
by the length limit (`finish(cut=True)`) also drops a held-back piece of a start marker and the
whitespace before it. `parse_tool_calls` is the splitter fed the whole text, so a whole
response and a stream of the same text agree.

Formats (FORMATS, checked in this order against a chat template's source by `detect_format`):

| name      | template / model         | start marker   | a call                                  |
|-----------|--------------------------|----------------|-----------------------------------------|
| qwen3-xml | Qwen3-coder              | <tool_call>    | <function=F><parameter=P>V</parameter>  |
| hermes    | Hermes, Qwen2.5, Qwen3   | <tool_call>    | {"name": F, "arguments": {...}}         |
| mistral   | Mistral                  | [TOOL_CALLS]   | [{"name": F, "arguments": {...}}, ...]  |
| llama3    | Llama 3.1-3.3            | <|python_tag|> | {"name": F, "parameters": {...}}; ...   |
|           |                          | or {"name" as  |                                         |
|           |                          | the reply opens|                                         |
| gemma     | Gemma (prompted)         | ```tool_code   | f(a=1) per line, or [f(a=1), g(b=2)]    |
| harmony   | gpt-oss (Harmony)        | <|channel|>com-| NAME <|constrain|>json<|message|>{...}  |
|           |                          | mentary to=fun-| <|call|> (harmony.py)                   |
|           |                          | ctions.        |                                         |
| generic   | templates without tools  | <tool_call>    | {"name": F, "arguments": {...}}         |

The generic row is exactdraft's own: the chat is rendered with the tools system prompt of
exactdraft.loading.chat_template.generic_tools_prompt, which lists the functions with their JSON
schemas and asks for <tool_call>{"name": ..., "arguments": {...}}</tool_call>.

Model text whose call markup does not parse (arguments that are not a JSON object, a function
that is not among the tools, a broken list) is a broken call: from the start marker of the
markup it sits in (with the whitespace before it) the rest of the text is content, markup
included, and no later call is read; calls of earlier markup stay calls. Whole or streamed, the
same text gives the same content, since a markup's calls are held back, and its text kept, until
it is read to its end (a list's calls come out together). The splitter logs the
reason (logger `exactdraft.server.tool_calls`, WARNING); `strict=True` raises it instead, as
ToolCallError naming the call. A text that ends inside a call (the length limit, or a stop token
inside the markup) ends that call as incomplete, without error, and the splitter drops it: an
incomplete call's arguments need not parse.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from exactdraft.constraints.constraint import COMPACT_JSON
from exactdraft.loading.chat_template import (
    GENERIC_CALL_END,
    GENERIC_CALL_START,
    template_supports_tools,
)
from exactdraft.server.tool_calls import harmony
from exactdraft.server.tool_calls.readers import (
    CallListReader,
    ClosedCallReader,
    MistralReader,
    PythonCallReader,
    ToolCallError,
    XmlCallReader,
)

__all__ = ["FORMATS", "CallArguments", "CallEnd", "CallStart", "Content", "ToolCall",
           "ToolCallError", "ToolCallSplitter", "ToolFormat", "constraint_grammar",
           "detect_format", "format_named", "held_back", "parse_tool_calls"]


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    text: str


@dataclass(frozen=True)
class CallEnd:
    index: int
    arguments: str  # the whole arguments string: the concatenated CallArguments texts
    complete: bool  # False: the text ended inside the call (the length limit)


Event = Content | CallStart | CallArguments | CallEnd


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object's text
    complete: bool = True


@dataclass(frozen=True)
class ToolFormat:
    """One row of the table: how to recognize the format in a chat template, where calls
    start, and the reader of what follows a start marker."""

    name: str
    markers: tuple[str, ...]
    reader: Callable[[Any], Any]
    detect: Callable[[str], bool]
    leading_json: bool = False  # a reply that opens with {"name" is a call (Llama 3.x)


def _has(*needles: str) -> Callable[[str], bool]:
    return lambda source: all(needle in source for needle in needles)


FORMATS: tuple[ToolFormat, ...] = (
    ToolFormat("qwen3-xml", ("<tool_call>",), XmlCallReader, _has("<function=", "<parameter=")),
    ToolFormat("hermes", ("<tool_call>",), lambda sink: ClosedCallReader(sink, "</tool_call>"),
               _has("<tool_call>")),
    ToolFormat("mistral", ("[TOOL_CALLS]",), MistralReader, _has("[TOOL_CALLS]")),
    ToolFormat("llama3", ("<|python_tag|>",),
               lambda sink: CallListReader(sink, bracketed=False),
               lambda source: "<|python_tag|>" in source or (
                   "<|start_header_id|>" in source and "parameters" in source),
               leading_json=True),
    ToolFormat("gemma", ("```tool_code",), PythonCallReader, _has("tool_code")),
    ToolFormat("harmony", harmony.MARKERS, harmony.HarmonyCallReader, harmony.detect),
    ToolFormat("generic", (GENERIC_CALL_START,),
               lambda sink: ClosedCallReader(sink, GENERIC_CALL_END), lambda source: True),
)
GENERIC = FORMATS[-1]


def format_named(name: str) -> ToolFormat:
    for row in FORMATS:
        if row.name == name:
            return row
    raise ToolCallError(f"unknown tool-call format {name!r}; known: "
                        + ", ".join(row.name for row in FORMATS))


def detect_format(template: str | None) -> ToolFormat:
    """The format a chat template's model writes calls in; the generic format for a template
    that does not render tools (then exactdraft renders its own tools prompt)."""
    if not template or not template_supports_tools(template):
        return GENERIC
    for row in FORMATS:
        if row.detect(template):
            return row
    return GENERIC


_LEADING = ('{"name"', '{ "name"')
logger = logging.getLogger("exactdraft.server.tool_calls")


class ToolCallSplitter:
    """Text deltas in, events out (see the module invariant). `tools`: function name ->
    parameters schema (a call to another name is a broken call); None accepts any name.
    `max_calls`: calls past this many are read and dropped (parallel_tool_calls false).
    `strict`: a broken call raises ToolCallError instead of turning into content."""

    def __init__(self, tool_format: ToolFormat,
                 tools: Mapping[str, Mapping[str, Any] | None] | None = None, *,
                 id_prefix: str = "call_", max_calls: int | None = None,
                 strict: bool = False) -> None:
        self.format, self.tools = tool_format, tools
        self.id_prefix, self.max_calls, self.strict = id_prefix, max_calls, strict
        self.broken = False  # a call did not parse: the rest of the text is content
        self.call_text = ""  # the call being read, from its start marker, as consumed so far
        self.call_space = ""  # the whitespace before that call's start marker
        self.pending = ""
        self.reader: Any = None
        self.calls: list[tuple[str, str]] = []  # (id, name) by index
        self.events: list[Event] = []
        self.opened = False  # content other than whitespace, or a call, has been seen
        self.space = ""  # trailing whitespace of the content, held back
        self.held: list[Event] = []  # the events of the call being read, until it completes
        # The complete calls of the markup being read (a list holds several), until the markup
        # is read to its end (or the text ends inside it): a broken list is content whole.
        self.ready: list[Event] = []
        self.cut = False

    # -- the sink the readers report to ----------------------------------------------------

    def start(self, name: str) -> int:
        index = len(self.calls)
        # A call past max_calls is dropped whatever its name, as a good one is.
        if self.tools is not None and name not in self.tools and (
                self.max_calls is None or index < self.max_calls):
            raise ToolCallError(f"tool call {index} names {name[:80]!r}, which is not one of "
                                f"the tools ({', '.join(sorted(self.tools))})")
        call_id = f"{self.id_prefix}{index}"
        self.calls.append((call_id, name))
        self.held.append(CallStart(index, call_id, name))
        return index

    def arguments(self, index: int, text: str) -> None:
        self.held.append(CallArguments(index, text))

    def end(self, index: int, arguments: str, complete: bool) -> None:
        # An incomplete call (the text ended inside it) is dropped with what it held.
        held, self.held = self.held, []
        if complete and (self.max_calls is None or index < self.max_calls):
            self.ready += [*held, CallEnd(index, arguments, complete)]

    def schema(self, name: str) -> dict[str, Any] | None:
        found = (self.tools or {}).get(name)
        return dict(found) if found is not None else None

    # -- text in, events out ---------------------------------------------------------------

    def feed(self, text: str) -> list[Event]:
        self.pending += text
        return self._drain(final=False)

    def finish(self, cut: bool = False) -> list[Event]:
        """Events for the text held back; the splitter is spent afterwards. `cut`: the text
        was cut by the length limit, so a held-back piece of a start marker is markup cut short
        and is dropped (with the whitespace before it), not content."""
        self.cut = cut
        return self._drain(final=True)

    def _content(self, text: str) -> None:
        """Content, less trailing whitespace: that waits for more content, and is dropped if a
        call comes next (or the text ends after a call), so calls take no blank lines along."""
        text = self.space + text
        body = text.rstrip()
        self.space = text[len(body):]
        if body:
            self.opened = True
            self.events.append(Content(body))

    def _break(self, error: ToolCallError) -> None:
        """The call being read does not parse: its text, the whitespace before it and all
        that follows are content."""
        if self.strict:
            raise error
        logger.warning("a tool call in the model's text (calls %s*) does not parse, so it is "
                       "sent as content: %s", self.id_prefix, error)
        self.held, self.ready, self.reader, self.broken = [], [], None, True
        self.pending = self.call_space + self.call_text + self.pending

    def _open_call(self, space: str, text: str) -> None:
        self.call_space, self.call_text = space, text
        self.reader = self.format.reader(self)

    def _drain(self, final: bool) -> list[Event]:
        while True:
            if self.broken:
                self._content(self.pending)
                self.pending = ""
                if final and self.space:
                    self.events.append(Content(self.space))
                    self.space = ""
                break
            if self.reader is not None:
                try:
                    used, done = self.reader.feed(self.pending, final)
                except ToolCallError as error:
                    self._break(error)
                    continue
                self.call_text += self.pending[:used]
                self.pending = self.pending[used:]
                if done or final:  # read to its end, or the text ended inside it
                    self.events += self.ready
                    self.ready = []
                if not done:
                    if final:
                        self.pending, self.reader = "", None
                    break
                self.reader = None
                continue
            if self.format.leading_json and not self.opened:
                head = self.pending.lstrip()
                if any(lead.startswith(head) for lead in _LEADING) and not final:
                    break  # could still open with a call
                if head and any(lead.startswith(head) for lead in _LEADING) and self.cut:
                    self.pending = ""  # a call's opening cut short
                    break
                if head.startswith(_LEADING):
                    space = self.space + self.pending[:len(self.pending) - len(head)]
                    self.pending, self.opened, self.space = head, True, ""
                    self._open_call(space, "")
                    continue
            found = [(at, marker) for marker in self.format.markers
                     if (at := self.pending.find(marker)) >= 0]
            if found:
                at, marker = min(found)
                self._content(self.pending[:at])
                space, self.space = self.space, ""
                self.pending, self.opened = self.pending[at + len(marker):], True
                self._open_call(space, marker)
                continue
            held = held_back(self.pending, self.format.markers)
            if final and not (self.cut and held):
                held = 0  # the end of the text: what could have been a marker is content
            self._content(self.pending[:len(self.pending) - held])
            self.pending = self.pending[len(self.pending) - held:]
            if final and self.pending:  # a start marker cut short, with its whitespace
                self.pending = self.space = ""
            if final and self.space and not self.calls:  # a text without calls stays whole
                self.events.append(Content(self.space))
            break
        events, self.events = self.events, []
        return events


def held_back(text: str, markers: Sequence[str]) -> int:
    """The length of the longest end of `text` that is the start of a marker."""
    for size in range(min(len(text), max(len(m) for m in markers) - 1), 0, -1):
        tail = text[-size:]
        if any(marker.startswith(tail) for marker in markers):
            return size
    return 0


def parse_tool_calls(text: str, tool_format: ToolFormat,
                     tools: Mapping[str, Mapping[str, Any] | None] | None = None, *,
                     id_prefix: str = "call_", max_calls: int | None = None,
                     cut: bool = False, strict: bool = False) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole model text: the splitter fed the text at once (`cut`: see
    ToolCallSplitter.finish; `strict`: a broken call raises ToolCallError)."""
    splitter = ToolCallSplitter(tool_format, tools, id_prefix=id_prefix, max_calls=max_calls,
                                strict=strict)
    return collect(splitter.feed(text) + splitter.finish(cut))


def collect(events: Sequence[Event]) -> tuple[str, list[ToolCall]]:
    """(content, calls) from a list of events."""
    content, calls, names = [], {}, {}
    for event in events:
        if isinstance(event, Content):
            content.append(event.text)
        elif isinstance(event, CallStart):
            names[event.index] = (event.id, event.name)
        elif isinstance(event, CallEnd):
            calls[event.index] = ToolCall(*names[event.index], event.arguments, event.complete)
    return "".join(content), [calls[index] for index in sorted(calls)]


# -- the constraint hook ------------------------------------------------------------------

def _literal(text: str) -> str:
    return json.dumps(text)  # a JSON string is a Lark string literal


def _call_rule(tool_format: ToolFormat, function: Mapping[str, Any], head: bool = True) -> str:
    # Arguments are written as response_format's JSON is (COMPACT_JSON), unless the schema
    # says otherwise: free whitespace lets a small model spend its tokens on indentation.
    schema = dict(function.get("parameters") or {"type": "object"})
    schema.setdefault("x-guidance", COMPACT_JSON)
    schema = json.dumps(schema)
    name = function["name"]
    if tool_format.name in ("hermes", "generic"):
        # Hermes models write the JSON on its own line; the generic prompt shows one line.
        line = "\n" if tool_format.name == "hermes" else ""
        head, key = (GENERIC_CALL_START if head else "") + line, "arguments"
        tail = "}" + line + GENERIC_CALL_END
    elif tool_format.name in ("mistral", "llama3"):
        head, key, tail = "", "arguments" if tool_format.name == "mistral" else "parameters", "}"
    else:
        raise ToolCallError(f"no call grammar for the {tool_format.name} format")
    prefix = head + '{"name": ' + json.dumps(name) + ', "' + key + '": '
    return f"{_literal(prefix)} %json {schema} {_literal(tail)}"


def constraint_grammar(tool_format: ToolFormat, functions: Sequence[Mapping[str, Any]],
                       choice: str, parallel: bool, special_markers: bool = False) -> str | None:
    """The Lark grammar (llguidance's dialect, for `Constraint.grammar`) a request's output
    must follow, or None when the output is free.

    `choice`: "required" (at least one call to any function), "auto" (free text, but the
    arguments of calls to functions marked strict follow their schemas), or a function name
    (exactly that function). Calls are written with fixed spacing, so everything but the
    arguments is forced. Formats without a grammar here (qwen3-xml, gemma) return None;
    Harmony's forced calls are harmony.call_grammar's (`special_markers`: the tokenizer has
    Harmony's markers as special tokens, which the grammar then names)."""
    if tool_format.name == "harmony":
        return harmony.call_grammar(functions, choice, parallel, special_markers)
    if choice == "none" or tool_format.name not in ("hermes", "generic", "mistral", "llama3"):
        return None
    if choice == "auto":
        strict = [f for f in functions if f.get("strict")]
        if not strict or tool_format.name not in ("hermes", "generic"):
            return None
    if choice == "auto":
        chosen = [f for f in functions if f.get("strict")]
    elif choice == "required":
        chosen = list(functions)
    else:
        chosen = [f for f in functions if f["name"] == choice]
    if not chosen:
        raise ToolCallError(f"tool_choice names {choice!r}, which is not one of the tools")
    auto = choice == "auto"  # the text before a call then ends with the start marker
    rules = [f"call_{i}: {_call_rule(tool_format, f, head=not auto)}"
             for i, f in enumerate(chosen)]
    calls = " | ".join(f"call_{i}" for i in range(len(chosen)))
    if tool_format.name == "mistral":
        more = ' ("," call)*' if parallel else ""
        start = f'start: "[TOOL_CALLS][" call{more} "]"'
    elif tool_format.name == "llama3":
        start = 'start: call ("; " call)*' if parallel else "start: call"
    elif auto:
        # Free text up to the first start marker (a lazy match ends right there), a call,
        # and so on; the text after the last call holds no start marker.
        marker = re.escape(GENERIC_CALL_START)
        start = "start: text_call* TAIL?"
        rules += ["text_call: text call", f"text[lazy]: /(?s:.*){marker}/",
                  f"TAIL: /(?s:.+)/ & ~/(?s:.*){marker}(?s:.*)/"]
    else:
        start = 'start: call ("\\n" call)*' if parallel else "start: call"
    if auto:  # calls to functions not marked strict take any arguments object
        loose = [{"name": f["name"]} for f in functions if not f.get("strict")]
        rules += [f"free_{i}: {_call_rule(tool_format, f, head=False)}"
                  for i, f in enumerate(loose)]
        calls += "".join(f" | free_{i}" for i in range(len(loose)))
    return "\n".join([start, f"call: {calls}", *rules]) + "\n"
