"""The kinds of constraint, one row each: the name the server's `constraint` field and the
Python API use, the command line's flag, and how a value of that kind becomes a Constraint.

Invariant: this table is the only list of constraint kinds; the server's request check, the
command line's flags and their help all read it, so a kind is offered everywhere or nowhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exactdraft.constraints.constraint import Constraint


@dataclass(frozen=True)
class ConstraintKind:
    name: str  # the key of the server's `constraint` object and the Constraint classmethod
    build: Callable[[Any], Constraint]
    flag_help: str  # the command line's help for --<name with dashes>
    # How the command line reads its argument: "text" as given, "path" a file's text,
    # "json_or_path" JSON text or a file holding it, "comma_list" comma-separated texts.
    flag_argument: str
    flag_metavar: str | None = None
    # Whether a value may come with special_tokens (the special tokens a grammar names).
    names_special_tokens: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


KINDS: tuple[ConstraintKind, ...] = (
    ConstraintKind("json_schema", Constraint.json_schema,
                   "constrain the reply to a JSON schema: the schema's JSON text or a file "
                   "holding it", "json_or_path", "SCHEMA"),
    ConstraintKind("regex", Constraint.regex, "constrain the reply to a regular expression",
                   "text"),
    ConstraintKind("grammar", Constraint.grammar,
                   "constrain the reply to a Lark grammar read from PATH", "path", "PATH",
                   names_special_tokens=True),
    ConstraintKind("gbnf", Constraint.gbnf,
                   "constrain the reply to a GBNF grammar (llama.cpp's syntax) read from PATH",
                   "path", "PATH", names_special_tokens=True),
    ConstraintKind("choices", Constraint.choices,
                   "constrain the reply to one of these comma-separated texts", "comma_list",
                   "A,B,..."),
)
BY_NAME = {kind.name: kind for kind in KINDS}
