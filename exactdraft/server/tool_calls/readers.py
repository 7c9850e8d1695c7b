"""Readers of one format's tool-call markup, fed the text that follows a start marker.

Invariant: a reader's output depends only on the text, never on how it was cut into pieces: it
acts only on text it has seen whole (a complete key, a complete closing tag) or that can no
longer change meaning (characters inside a JSON value whose end it is tracking), and otherwise
leaves the text unconsumed until more arrives. A reader reports how many characters of the
pending text it consumed; the rest belongs to whoever reads next.

A reader talks to its owner (the splitter in exactdraft/server/tool_calls/formats.py) through
`CallSink`: `start(name) -> index`, `arguments(index, text)`,
`end(index, arguments_text, complete)`.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Protocol


class ToolCallError(ValueError):
    """Model text holds tool-call markup that does not parse; the message names the call (its
    index and function) and what is wrong."""


class CallSink(Protocol):
    def start(self, name: str) -> int: ...
    def arguments(self, index: int, text: str) -> None: ...
    def end(self, index: int, arguments: str, complete: bool) -> None: ...
    def schema(self, name: str) -> dict[str, Any] | None: ...


class JsonEnd:
    """Where one JSON object or array ends, found from pieces fed in order (strings and their
    escapes are tracked so braces inside strings do not count)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.depth, self.in_string, self.escaped, self.started = 0, False, False, False

    def feed(self, text: str) -> int | None:
        """The index in `text` just past the value's end, or None if it has not ended."""
        for position, char in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif not self.started and char not in "{[":
                if not char.isspace():
                    raise ToolCallError(f"{self.what} is not a JSON object: it starts with "
                                        f"{char!r}")
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
                self.started = True
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return position + 1
        return None


def arguments_object(value: Any, what: str) -> dict[str, Any]:
    """A call's arguments as a dict: an object, or a string holding one (some models quote it)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ToolCallError(f"{what}: the arguments string is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ToolCallError(f"{what}: the arguments are {type(value).__name__}, not an object")
    return value


# The common key order: name, then arguments (Llama calls them parameters), then their object.
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"'
                   r'\s*:\s*(?=\{)')


class JsonCallReader:
    """One call written as a JSON object {"name": ..., "arguments" | "parameters": {...}}.

    In the common key order the arguments stream as the model writes them (the text of the
    arguments object, exactly); in any other order the call is announced when its object ends,
    with the arguments as compact JSON. Either way the arguments must parse as a JSON object."""

    def __init__(self, sink: CallSink) -> None:
        self.sink = sink
        self.text = ""
        self.object_end = JsonEnd("a tool call")
        self.index: int | None = None
        self.name = ""
        self.arguments_from = self.arguments_sent = 0
        self.arguments_end: JsonEnd | None = None
        self.arguments_done = False

    def feed(self, pending: str, final: bool) -> tuple[int, bool]:
        end = self.object_end.feed(pending)
        self.text += pending if end is None else pending[:end]
        if self.index is None:
            head = _HEAD.match(self.text)
            if head is not None:
                self.name = json.loads(f'"{head.group(1)}"')
                self.index = self.sink.start(self.name)
                self.arguments_from = self.arguments_sent = head.end()
                self.arguments_end = JsonEnd(f"tool call {self.index} ({self.name})")
        if self.arguments_end is not None and not self.arguments_done:
            piece = self.text[self.arguments_sent:]
            stop = self.arguments_end.feed(piece)
            piece = piece if stop is None else piece[:stop]
            if piece:
                self.sink.arguments(self.index, piece)
            self.arguments_sent += len(piece)
            self.arguments_done = stop is not None
        if end is None:
            if final:
                self.close()
            return len(pending), False
        self._finish()
        return end, True

    def _finish(self) -> None:
        what = "a tool call" if self.index is None else f"tool call {self.index} ({self.name})"
        try:
            value = json.loads(self.text)
        except json.JSONDecodeError as error:
            raise ToolCallError(f"{what} is not valid JSON: {error}: {self.text[:200]!r}") \
                from None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise ToolCallError(f"{what} has no function name: {self.text[:200]!r}")
        key = "arguments" if "arguments" in value else "parameters"
        if self.index is None:
            self.name = value["name"]
            self.index = self.sink.start(self.name)
            what = f"tool call {self.index} ({self.name})"
            arguments = arguments_object(value.get(key, {}), what)
            text = json.dumps(arguments, ensure_ascii=False)
            self.sink.arguments(self.index, text)
        else:
            text = self.text[self.arguments_from:self.arguments_sent]
        self.sink.end(self.index, text, True)

    def close(self) -> None:
        """The text ended inside the object (the length limit): the call ends incomplete."""
        if self.index is not None:
            self.sink.end(self.index, self.text[self.arguments_from:self.arguments_sent], False)


def _take_literal(pending: str, literal: str, final: bool, what: str) -> int | None:
    """Characters consumed by optional whitespace then `literal` at the start of `pending`;
    None while `pending` could still become that; ToolCallError if it cannot."""
    stripped = pending.lstrip()
    skipped = len(pending) - len(stripped)
    if stripped.startswith(literal):
        return skipped + len(literal)
    if literal.startswith(stripped) and not final:
        return None
    raise ToolCallError(f"{what}: expected {literal!r}, got {stripped[:40]!r}")


def _closing(pending: str, closing: str, final: bool, what: str) -> int | None:
    """_take_literal of a call's closing tag, where the text may end before the tag or inside
    it (the model stopped, or the length limit cut it): the call was complete already."""
    if final and closing.startswith(pending.strip()):
        return len(pending)
    return _take_literal(pending, closing, final, what)


class ClosedCallReader:
    """A JSON call object followed by a closing tag (Hermes and the generic format:
    <tool_call>{...}</tool_call>). A text that ends after the object without the tag (the
    model stopped there) still completes the call."""

    def __init__(self, sink: CallSink, closing: str) -> None:
        self.call, self.closing, self.called = JsonCallReader(sink), closing, False

    def feed(self, pending: str, final: bool) -> tuple[int, bool]:
        used = 0
        if not self.called:
            used, self.called = self.call.feed(pending, final)
            if not self.called:
                return used, False
        rest = pending[used:]
        taken = _closing(rest, self.closing, final,
                         f"tool call {self.call.index} ({self.call.name})")
        return (used, False) if taken is None else (used + taken, True)


class CallListReader:
    """JSON call objects in a list ([{...}, {...}], Mistral) or separated by ';' and whitespace
    (Llama 3.x); whatever follows the last call is handed back as text."""

    def __init__(self, sink: CallSink, bracketed: bool) -> None:
        self.sink, self.bracketed = sink, bracketed
        self.state = "open" if bracketed else "call"
        self.call: JsonCallReader | None = None

    def feed(self, pending: str, final: bool) -> tuple[int, bool]:
        used = 0
        while True:
            rest = pending[used:]
            if self.state == "open":
                taken = _take_literal(rest, "[", final, "a tool-call list")
                if taken is None:
                    return used, False
                used, self.state = used + taken, "call"
            elif self.state == "call":
                if self.call is None:
                    self.call = JsonCallReader(self.sink)
                taken, done = self.call.feed(rest, final)
                used += taken
                if not done:
                    return used, False
                self.call, self.state = None, "between"
            else:
                stripped = rest.lstrip()
                if not stripped:
                    return (len(pending), True) if final else (used, False)
                skipped = len(rest) - len(stripped)
                if self.bracketed and stripped[0] in ",]":
                    used += skipped + 1
                    if stripped[0] == "]":
                        return used, True
                    self.state = "call"
                elif not self.bracketed and stripped[0] in ";{":
                    used += skipped + (stripped[0] == ";")
                    self.state = "call"
                elif self.bracketed:
                    raise ToolCallError(f"a tool-call list continues with {stripped[:40]!r} "
                                        "instead of ',' or ']'")
                else:
                    return used, True


class MistralReader:
    """[TOOL_CALLS] then a JSON list of calls, or (newer templates) NAME[ARGS]{...} per call."""

    def __init__(self, sink: CallSink) -> None:
        self.sink = sink
        self.inner: Any = None

    def feed(self, pending: str, final: bool) -> tuple[int, bool]:
        if self.inner is None:
            stripped = pending.lstrip()
            if not stripped:
                return (len(pending), True) if final else (0, False)
            if stripped[0] == "[":
                self.inner = CallListReader(self.sink, bracketed=True)
            else:
                self.inner = NamedArgumentsReader(self.sink)
        return self.inner.feed(pending, final)


class NamedArgumentsReader:
    """NAME[ARGS]{json} (Mistral's newer call syntax): the arguments stream as written."""

    def __init__(self, sink: CallSink) -> None:
        self.sink = sink
        self.index: int | None = None
        self.name = ""
        self.sent = ""
        self.end: JsonEnd | None = None

    def feed(self, pending: str, final: bool) -> tuple[int, bool]:
        used = 0
        if self.index is None:
            at = pending.find("[ARGS]")
            if at < 0:  # at the end of the text: cut before its arguments, no call
                return (len(pending), False) if final else (0, False)
            self.name = pending[:at].strip()
            self.index = self.sink.start(self.name)
            self.end = JsonEnd(f"tool call {self.index} ({self.name})")
            used = at + len("[ARGS]")
        rest = pending[used:]
        stop = self.end.feed(rest)
        piece = rest if stop is None else rest[:stop]
        if piece.strip() or self.sent:
            piece = piece if self.sent else piece.lstrip()
            self.sink.arguments(self.index, piece)
            self.sent += piece
        if stop is None:
            if final:
                self.sink.end(self.index, self.sent, False)
            return len(pending), False
        what = f"tool call {self.index} ({self.name})"
        try:
            arguments_object(json.loads(self.sent), what)
        except json.JSONDecodeError as error:
            raise ToolCallError(f"{what}: the arguments are not JSON: {error}") from None
        self.sink.end(self.index, self.sent, True)
        return used + stop, True


def _parameter_value(text: str, schema: dict[str, Any] | None, what: str) -> Any:
    """A Qwen3-coder parameter's text as the type its schema gives (strings stay text)."""
    kind = (schema or {}).get("type")
    if kind == "string":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        if kind is None:
            return text
        raise ToolCallError(f"{what} is not a {kind}: {text[:80]!r}") from None


class XmlCallReader:
    """Qwen3-coder: <function=NAME> then <parameter=P>VALUE</parameter>... </function>
    </tool_call>. Arguments stream one parameter at a time, as JSON built from the values (typed
    by the function's schema)."""

    def __init__(self, sink: CallSink) -> None:
        self.sink = sink
        self.index: int | None = None
        self.name = ""
        self.sent = ""
        self.done = False

    def _emit(self, text: str) -> None:
        self.sink.arguments(self.index, text)
        self.sent += text

    def feed(self, pending: str, final: bool) -> tuple[int, bool]:
        used = 0
        while True:
            rest = pending[used:]
            stripped = rest.lstrip()
            skipped = len(rest) - len(stripped)
            if self.done:
                taken = _closing(rest, "</tool_call>", final, f"tool call {self.index}")
                return (used, False) if taken is None else (used + taken, True)
            opening = "<function=" if self.index is None else "<parameter="
            if self.index is not None and stripped.startswith("</function>"):
                self._emit("}" if self.sent else "{}")
                self.sink.end(self.index, self.sent, True)
                self.done, used = True, used + skipped + len("</function>")
                continue
            if not stripped.startswith(opening):
                could_be = opening.startswith(stripped) or (
                    self.index is not None and "</function>".startswith(stripped))
                if could_be and not final:
                    return used, False
                if final and (could_be or self.index is not None):
                    self._incomplete(pending)  # cut by the length limit inside the call
                    return len(pending), False
                raise ToolCallError(f"tool call {self.index if self.index is not None else ''}"
                                    f" expected {opening!r}, got {stripped[:40]!r}")
            close = stripped.find(">")
            if close < 0:
                return (len(pending), self._incomplete(pending)) if final else (used, False)
            key = stripped[len(opening):close].strip()
            if self.index is None:
                self.name = key
                self.index = self.sink.start(key)
                used += skipped + close + 1
                continue
            value_end = stripped.find("</parameter>", close)
            if value_end < 0:
                return (len(pending), self._incomplete(pending)) if final else (used, False)
            value = stripped[close + 1:value_end]
            value = value[1:] if value.startswith("\n") else value
            value = value[:-1] if value.endswith("\n") else value
            schema = (self.sink.schema(self.name) or {}).get("properties", {}).get(key)
            what = f"tool call {self.index} ({self.name}) parameter {key!r}"
            typed = _parameter_value(value, schema, what)
            self._emit(("{" if not self.sent else ", ") + json.dumps(key, ensure_ascii=False)
                       + ": " + json.dumps(typed, ensure_ascii=False))
            used += skipped + value_end + len("</parameter>")

    def _incomplete(self, pending: str) -> bool:
        if self.index is not None:
            self.sink.end(self.index, self.sent, False)
        return False


class PythonCallReader:
    """Gemma style: a ```tool_code block holding Python calls, `f(a=1)` per line or a list
    `[f(a=1), g(b="x")]`; literal keyword arguments only (read with ast.literal_eval, never
    run). Each call is announced when the block closes."""

    def __init__(self, sink: CallSink) -> None:
        self.sink = sink

    def feed(self, pending: str, final: bool) -> tuple[int, bool]:
        end = pending.find("```")
        if end < 0:
            if final:
                return len(pending), False  # cut by the length limit: no complete call
            return 0, False
        source = pending[:end].strip()
        lines = ", ".join(line for line in source.splitlines() if line.strip())
        try:  # one expression (a call or a list of calls), else one call per line
            tree = ast.parse(source, mode="eval").body
        except SyntaxError:
            try:
                tree = ast.parse(f"[{lines}]", mode="eval").body
            except SyntaxError as error:
                raise ToolCallError(f"a tool_code block is not Python calls: {error.msg}: "
                                    f"{source[:120]!r}") from None
        calls = tree.elts if isinstance(tree, ast.List) else [tree]
        for call in calls:
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args:
                raise ToolCallError(f"a tool_code block holds {ast.unparse(call)[:80]!r}, not a "
                                    "call with keyword arguments")
            arguments = {}
            for keyword in call.keywords:
                try:
                    arguments[keyword.arg] = ast.literal_eval(keyword.value)
                except ValueError:
                    raise ToolCallError(f"tool call {call.func.id}: argument {keyword.arg!r} is "
                                        "not a literal") from None
            index = self.sink.start(call.func.id)
            text = json.dumps(arguments, ensure_ascii=False)
            self.sink.arguments(index, text)
            self.sink.end(index, text, True)
        return end + 3, True
