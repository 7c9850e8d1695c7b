"""Chat templates from checkpoint files, rendered as untrusted code.

Invariant: a template renders only inside jinja2's immutable sandbox, and under bounds it cannot
escape: at most `max_seconds` of rendering, `max_steps` loop iterations and calls, and
`max_characters` of output; a template past any of them, one that recurses without end, or one
that fails, raises a TokenizerError saying which bound or error, and leaves nothing behind.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
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
