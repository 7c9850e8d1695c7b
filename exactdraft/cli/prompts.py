"""Where the command line's prompts come from: an argument, a file, stdin, or a prompt list.

Invariant: every prompt is read, and every unreadable or empty one refused with a message naming
the flag and the file, before a model loads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from exactdraft.cli.common import DEFAULT_PROMPTS, STDIN, chat_messages, is_terminal


def read_prompt_source(args: argparse.Namespace) -> tuple[str, bool | None]:
    """The prompt text, and whether it is a chat message (None: chat when the model has a
    chat template, as for --prompt-file and stdin). Read here, before any model loads."""
    from exactdraft.errors import ParameterError

    given = [name for name, value in (("--prompt", args.prompt), ("--chat", args.chat),
                                      ("--prompt-file", args.prompt_file),
                                      (STDIN, args.stdin)) if value is not None]
    if len(given) != 1:
        raise ParameterError("generate needs one prompt: --prompt TEXT, --chat TEXT, "
                             "--prompt-file PATH or - (stdin); got "
                             f"{' and '.join(given) or 'none'}")
    if args.raw and (args.prompt is not None or args.chat is not None):
        raise ParameterError("--raw applies to --prompt-file and stdin; --prompt is raw and "
                             "--chat is a chat message already")
    if args.prompt is not None:
        return _read_text(args.prompt, "--prompt "), False
    if args.chat is not None:
        return _read_text(args.chat, "--chat "), True
    if args.prompt_file is not None:
        return _read_text(args.prompt_file, "--prompt-file ", path=True), \
            False if args.raw else None
    return _read_text(STDIN, "", path=True), False if args.raw else None


def _read_text(value: str, flag: str, path: bool = False) -> str:
    """`value` itself, or the text of stdin (`-`) or of the file `value` names (`path`), with
    one trailing newline dropped (what `echo` adds). `flag` starts error messages."""
    from exactdraft.errors import ParameterError

    if value != STDIN and not path:
        return value
    where = "stdin" if value == STDIN else value
    try:
        if value == STDIN:
            if is_terminal(sys.stdin):
                print("exactdraft: reading the prompt from stdin (end it with Ctrl-D)",
                      file=sys.stderr)
            text = sys.stdin.read()
        else:
            with open(os.path.expanduser(value), encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise ParameterError(f"{flag}{where}: cannot be read ({error})") from None
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    if not text.strip():
        raise ParameterError(f"{flag}{where}: the prompt is empty")
    return text


def read_prompts(path: str | None, raw: bool) -> list[Any]:
    from exactdraft.errors import ParameterError

    try:
        if path is None:
            texts: list[Any] = list(DEFAULT_PROMPTS)
        elif path.endswith(".jsonl"):
            with open(path, encoding="utf-8") as handle:
                texts = []
                for number, line in enumerate(handle, 1):
                    if line.strip():
                        try:
                            texts.append(json.loads(line))
                        except json.JSONDecodeError as error:
                            raise ParameterError(f"{path}, line {number}: not JSON "
                                                 f"({error.msg})") from None
        else:
            with open(path, encoding="utf-8") as handle:
                texts = [line.rstrip("\n").replace("\\n", "\n") for line in handle
                         if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        raise ParameterError(f"--prompts {path}: cannot be read ({error})") from None
    if not texts:
        raise ParameterError(f"no prompts in {path}")
    return [t if raw or not isinstance(t, str) else chat_messages(t) for t in texts]


def read_constraint(args: argparse.Namespace) -> Any:
    """The Constraint that a constraint flag (one per row of constraints/kinds.py: --json-schema,
    --regex, --grammar, --gbnf, --choices) names, or None; a bad one is refused (naming the flag)
    before a model loads. --special-tokens declares the special tokens a --grammar or --gbnf
    names (Constraint.grammar's special_tokens)."""
    from exactdraft.constraints.kinds import KINDS
    from exactdraft.errors import ConstraintError, ParameterError

    given = [(kind, getattr(args, kind.name)) for kind in KINDS
             if getattr(args, kind.name, None) is not None]
    special = getattr(args, "special_tokens", None)
    names = [] if special is None else [name for name in special.split(",") if name]
    takers = " or ".join(k.flag for k in KINDS if k.names_special_tokens)
    if names and (not given or not given[0][0].names_special_tokens):
        raise ParameterError(f"--special-tokens goes with {takers}")
    if not given:
        return None
    kind, value = given[0]
    flag = kind.flag
    try:
        if kind.flag_argument == "json_or_path":
            text = value if value.lstrip().startswith("{") else \
                _read_text(value, f"{flag} ", path=True)
            try:
                value = json.loads(text)
            except json.JSONDecodeError as error:
                raise ParameterError(f"{flag}: not JSON ({error})") from None
        elif kind.flag_argument == "path":
            value = _read_text(value, f"{flag} ", path=True)
        elif kind.flag_argument == "comma_list":
            value = [choice for choice in value.split(",") if choice]
        return kind.build(value, special_tokens=names) if names else kind.build(value)
    except ConstraintError as error:
        from exactdraft.constraints.special_tokens import DECLARE_HINT

        reason = str(error).replace(DECLARE_HINT, "--special-tokens NAME,...")
        raise ParameterError(f"{flag}: {reason}") from None
