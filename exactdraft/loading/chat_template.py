"""Chat templates from checkpoint files, rendered as untrusted code.

Invariant: a template renders only inside jinja2's immutable sandbox, and under bounds it cannot
escape: at most `max_seconds` of rendering, `max_steps` loop iterations and calls, and
`max_characters` of output; a template past any of them, one that recurses without end, or one
that fails, raises a TokenizerError saying which bound or error, and leaves nothing behind.

Tools: a template renders `tools=` (and assistant `tool_calls`, `role: tool` messages) only when
its source uses both `tools` and `tool_calls` (`template_supports_tools`); for any other template
`render_chat_with_tools` renders exactdraft's generic tools prompt instead (GENERIC_TOOLS_PROMPT,
below) and writes the history's calls and results as text the template can render, so a chat
with tools renders on every checkpoint that has a chat template.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from exactdraft.errors import TokenizerError

MAX_SECONDS = 5.0
MAX_STEPS = 2_000_000
MAX_CHARACTERS = 8_000_000


class _Budget:
    """Steps and time left for one render; every sandboxed call and loop step spends one."""

    def __init__(self, max_seconds: float, max_steps: int) -> None:
        self.deadline = time.monotonic() + max_seconds
        self.max_seconds, self.steps_left, self.max_steps = max_seconds, max_steps, max_steps

    def spend(self) -> None:
        self.steps_left -= 1
        if self.steps_left < 0:
            raise TokenizerError(f"the chat template ran more than {self.max_steps} loop steps "
                                 "and calls; refusing it")
        if self.steps_left % 1024 == 0 and time.monotonic() > self.deadline:
            raise TokenizerError(f"the chat template ran longer than {self.max_seconds:g} s; "
                                 "refusing it")


class ChatTemplate:
    """A compiled chat template with render bounds (see the module invariant)."""

    def __init__(self, source: str, *, max_seconds: float = MAX_SECONDS,
                 max_steps: int = MAX_STEPS, max_characters: int = MAX_CHARACTERS) -> None:
        from jinja2 import TemplateError
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not isinstance(source, str):
            raise TokenizerError(f"a chat template must be a string, got {type(source).__name__}")
        self.max_seconds, self.max_steps = max_seconds, max_steps
        self.max_characters = max_characters
        self._budget: _Budget | None = None
        template = self

        class BoundedEnvironment(ImmutableSandboxedEnvironment):
            intercepted_binops = frozenset(["*", "**"])

            def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
                template._check_binop(operator, left, right)
                return super().call_binop(context, operator, left, right)

            def call(self, context: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
                template._spend()
                return super().call(context, obj, *args, **kwargs)

            def getattr(self, obj: Any, attribute: str) -> Any:
                template._spend()
                return super().getattr(obj, attribute)

            def getitem(self, obj: Any, argument: Any) -> Any:
                template._spend()
                return super().getitem(obj, argument)

        def raise_exception(message: str) -> None:
            raise TokenizerError(f"the chat template refused the messages: {message}")

        def tojson(value: Any, indent: int | None = None, separators: Any = None,
                   sort_keys: bool = False, ensure_ascii: bool = False) -> str:
            return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys,
                              ensure_ascii=ensure_ascii)

        def strftime_now(format: str) -> str:
            return datetime.now().strftime(format)

        def bounded_range(*args: int) -> Iterator[int]:
            for value in range(*args):
                template._spend()
                yield value

        environment = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                         extensions=[loopcontrols])
        environment.filters["tojson"] = tojson
        environment.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                                   range=bounded_range)
        try:
            self._template = environment.from_string(source)
        except TemplateError as error:
            raise TokenizerError(f"the chat template does not compile: {error}") from None
        except RecursionError:
            raise TokenizerError("the chat template is nested too deeply to compile") from None

    def _check_binop(self, operator: str, left: Any, right: Any) -> None:
        """Refuse a repetition or a power whose result would pass the output bound."""
        self._spend()
        if operator == "*":
            for sized, count in ((left, right), (right, left)):
                if isinstance(sized, (str, list, tuple)) and isinstance(count, int) \
                        and len(sized) * count > self.max_characters:
                    raise TokenizerError(f"the chat template builds a value of more than "
                                         f"{self.max_characters} items; refusing it")
        elif isinstance(left, int) and isinstance(right, int) and right > 0 \
                and abs(left) > 1 and right * max(abs(left), 2).bit_length() > 4096:
            raise TokenizerError(f"the chat template raises {left} to the power {right}; "
                                 "refusing it")

    def _spend(self) -> None:
        if self._budget is not None:
            self._budget.spend()

    def render(self, variables: Mapping[str, Any]) -> str:
        """The template's text for these variables, within the bounds."""
        from jinja2 import TemplateError

        self._budget = _Budget(self.max_seconds, self.max_steps)
        pieces, size = [], 0
        try:
            for piece in self._template.generate(**variables):
                self._budget.spend()
                size += len(piece)
                if size > self.max_characters:
                    raise TokenizerError(f"the chat template wrote more than "
                                         f"{self.max_characters} characters; refusing it")
                pieces.append(piece)
        except TemplateError as error:
            raise TokenizerError(f"the chat template failed to render: {error}") from None
        except RecursionError:
            raise TokenizerError("the chat template recursed without end") from None
        finally:
            self._budget = None
        return "".join(pieces)


# -- tools ------------------------------------------------------------------------------------

GENERIC_CALL_START = "<tool_call>"
GENERIC_CALL_END = "</tool_call>"
GENERIC_RESULT_START = "<tool_response>"
GENERIC_RESULT_END = "</tool_response>"

# The generic tools prompt, for templates that do not render tools. {functions}: one JSON object
# per line ({"name", "description", "parameters"}); {rule}: what the request requires.
GENERIC_TOOLS_PROMPT = """You can call functions. These are the functions, one JSON object a \
line, with the JSON schema of each function's arguments:
{functions}

To call a function, write exactly
<tool_call>{{"name": "<function name>", "arguments": <the arguments as a JSON object>}}</tool_call>
{rule}The result of each call comes back to you inside <tool_response></tool_response>. When you \
have what you need, answer in plain text."""

_RULES = {"auto": "Call a function only when it helps; otherwise answer in plain text.",
          "required": "You must call at least one of the functions."}

# Names a template uses when it renders tools: the `tools` variable and the messages' calls.
_USES_TOOLS = re.compile(r"\btools\b")
_USES_CALLS = re.compile(r"\btool_calls\b")


def template_supports_tools(source: str) -> bool:
    """Whether a chat template's source renders tools and the calls in the history."""
    return bool(_USES_TOOLS.search(source) and _USES_CALLS.search(source))


def generic_tools_prompt(functions: Sequence[Mapping[str, Any]], choice: str = "auto",
                         parallel: bool = True) -> str:
    """The system text listing `functions` ({"name", "description"?, "parameters"?}) and the
    generic call markup. `choice`: "auto", "required" or the one function's name."""
    lines = [json.dumps({"name": f["name"], "description": f.get("description") or "",
                         "parameters": f.get("parameters") or {"type": "object"}},
                        ensure_ascii=False) for f in functions]
    rule = _RULES.get(choice, f"You must call the function {choice}.")
    rule += "" if parallel else " Call at most one function at a time."
    return GENERIC_TOOLS_PROMPT.format(functions="\n".join(lines), rule=rule + "\n")


def generic_call_markup(name: str, arguments: Mapping[str, Any]) -> str:
    """One call written in the generic markup (as the generic prompt asks the model to)."""
    return (GENERIC_CALL_START + json.dumps({"name": name, "arguments": arguments},
                                            ensure_ascii=False) + GENERIC_CALL_END)


def _generic_history(messages: Sequence[Mapping[str, Any]],
                     tools_prompt: str) -> list[dict[str, str]]:
    """Messages with only system/user/assistant roles and text content: the tools prompt joins
    the system message, calls become call markup in the assistant's text, and tool results
    become user text; consecutive messages of one role are joined (templates that insist on
    alternating roles, such as Gemma's, accept the result)."""
    plain: list[dict[str, str]] = []
    system = [m for m in messages[:1] if m.get("role") == "system"]
    head = ((system[0].get("content") or "") + "\n\n") if system else ""
    plain.append({"role": "system", "content": head + tools_prompt})
    for message in messages[len(system):]:
        role, text = message.get("role"), message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            calls = [generic_call_markup(c["function"]["name"], c["function"]["arguments"])
                     for c in message["tool_calls"]]
            text = "\n".join(([text] if text else []) + calls)
        elif role == "tool":
            role = "user"
            text = GENERIC_RESULT_START + json.dumps(
                {"name": message.get("name"), "id": message.get("tool_call_id"),
                 "result": text}, ensure_ascii=False) + GENERIC_RESULT_END
        if plain and plain[-1]["role"] == role:
            plain[-1]["content"] += "\n\n" + text
        else:
            plain.append({"role": role, "content": text})
    return plain


def render_chat_with_tools(tokenizer: Any, messages: Sequence[Mapping[str, Any]],
                           functions: Sequence[Mapping[str, Any]], *, choice: str = "auto",
                           parallel: bool = True, native: bool | None = None) -> str:
    """The chat rendered for a request with tools.

    `messages`: {"role", "content"} plus, on assistant messages, `tool_calls`
    ([{"id", "type": "function", "function": {"name", "arguments": dict}}]) and, on `tool`
    messages, `tool_call_id` and `name`. `functions`: {"name", "description", "parameters"}.
    `native`: render through the template's own tools support (default: when the template has
    it); otherwise through the generic tools prompt. No functions (tool_choice none) renders
    the history alone."""
    if native is None:
        native = template_supports_tools(tokenizer.chat_template or "")
    if native:
        tools = [{"type": "function", "function": dict(f)} for f in functions]
        history = [{**m, "content": m.get("content") or ""} for m in messages]
        return tokenizer.render_chat(history, tools=tools or None)  # None as transformers
    prompt = generic_tools_prompt(functions, choice, parallel) if functions else None
    if prompt is None:
        history = _generic_history(messages, "")
        if not messages or messages[0].get("role") != "system":
            history = history[1:]
        else:
            history[0]["content"] = history[0]["content"].rstrip("\n")
        return tokenizer.render_chat(history)
    return tokenizer.render_chat(_generic_history(messages, prompt))
