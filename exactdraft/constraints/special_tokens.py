"""Grammars that name special tokens: checked without a model's tokenizer, and refused by name
for a tokenizer that lacks one.

llguidance's Lark dialect writes a special (control) token by its name, `<|channel|>`, where a
grammar wants that token itself and not its text; the tokenizer bridge (tokens.py) marks every
special token, so no grammar produces one from text, and a name in a grammar is the only way
to allow one. Invariant: a grammar that names special tokens declares them (`special_tokens`
of Constraint.grammar); it is checked when built against llguidance's byte vocabulary plus
exactly those tokens (`byte_tokenizer_with`), and compiled only for a tokenizer that has each
of them as a special token (`require_special`, a ConstraintError naming the missing one).
A name used without being declared is refused when built, with the hint to declare it, and so
is a token-id reference (llguidance's `<[1]>`, `<[1-5]>`), which would force a token by id past
the declaration (`refuse_token_ids`; the same text inside a "string", a /regex/ or a // comment
is not one).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from exactdraft.constraints.once import OncePer, once_per
from exactdraft.constraints.tokens import llguidance_module
from exactdraft.errors import ConstraintError

# llguidance's words for a grammar naming a special token its tokenizer lacks.
UNKNOWN_SPECIAL = "unknown special token"
# How a grammar declares the special tokens it names, in the Python API's words.
DECLARE_HINT = "Constraint.grammar(lark, special_tokens=[...])"
# Byte vocabularies kept, one per set of declared special tokens.
BYTE_VOCABULARIES = 32
_SPECIAL_NAMES = OncePer()  # bridge -> the names of its special tokens


def checked_names(special_tokens: Sequence[str]) -> tuple[str, ...]:
    """The declared special tokens as a sorted tuple without repeats (so the same set in any
    order builds one constraint); ConstraintError naming a value (by its index as given) that
    is not a token name llguidance can write (`<...>`, no whitespace)."""
    if isinstance(special_tokens, (str, bytes)) or not isinstance(special_tokens, Sequence):
        raise ConstraintError(f"special_tokens must be a list of token names, got "
                              f"{special_tokens!r}")
    for index, name in enumerate(special_tokens):
        if not is_token_name(name):
            raise ConstraintError(f"special_tokens[{index}] must be a special token's name "
                                  f"such as '<|channel|>', got {name!r}")
    return tuple(sorted(set(special_tokens)))


def is_token_name(name: object) -> bool:
    """Whether `name` is a special token's name as llguidance's grammars write one: `<...>`
    with no whitespace."""
    return isinstance(name, str) and len(name) >= 3 and name.startswith("<") and \
        name.endswith(">") and not any(c.isspace() for c in name)


class _BytesAndSpecials:
    """llguidance's TokenizerWrapper protocol over the 256 bytes, the named special tokens,
    and an eos after them: text is its bytes, one token each."""

    is_tokenizer_wrapper = True

    def __init__(self, names: tuple[str, ...]) -> None:
        self.tokens = [bytes([b]) for b in range(256)] + [n.encode("utf-8") for n in names]
        self.tokens.append(b"<|exactdraft-eos|>")
        self.special_token_ids = list(range(256, len(self.tokens)))
        self.eos_token_id = len(self.tokens) - 1
        self.bos_token_id = None

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else text)


@functools.lru_cache(maxsize=BYTE_VOCABULARIES)
def byte_tokenizer_with(names: tuple[str, ...]) -> Any:
    """An llguidance tokenizer of the 256 bytes plus the special tokens `names` (and an eos),
    for checking a grammar that names them before any model's tokenizer is involved."""
    return llguidance_module().LLTokenizer(_BytesAndSpecials(names), slices=[])


def special_names(bridge: Any) -> frozenset[str]:
    """The names of a tokenizer bridge's special tokens, found once per bridge (a bridge's
    tokens do not change)."""
    return once_per(bridge, _SPECIAL_NAMES, lambda: frozenset(
        bridge.tokens[i].decode("utf-8", errors="replace") for i in bridge.special_token_ids))


def require_special(names: Sequence[str], bridge: Any, kind: str) -> None:
    """ConstraintError naming each token of `names` that the bridge's tokenizer does not have
    as a special token (an ordinary token of that text does not count: the grammar wants the
    control token)."""
    if not names:
        return
    have = special_names(bridge)
    missing = [name for name in names if name not in have]
    if missing:
        raise ConstraintError(f"the {kind} names the special token(s) {', '.join(missing)}, "
                              f"which this tokenizer does not have as special tokens")


def token_id_references(lark: str) -> list[str]:
    """The token-id references (`<[...]>`) in a Lark grammar, in order, outside its "string"
    and /regex/ literals and // comments (where the same characters are text)."""
    found, index, size = [], 0, len(lark)
    while index < size:
        char = lark[index]
        if lark.startswith("//", index):
            end = lark.find("\n", index)
            index = size if end < 0 else end
        elif char in "\"/":
            index = _literal_end(lark, index)
        elif lark.startswith("<[", index):
            end = lark.find("]>", index + 2)
            if end < 0:
                break  # not a reference; llguidance says what is wrong
            found.append(lark[index:end + 2])
            index = end + 2
        else:
            index += 1
    return found


def _literal_end(lark: str, start: int) -> int:
    """The index just past the "string" or /regex/ literal opening at `start` (a backslash
    escapes the next character; an unclosed literal runs to the end of its line)."""
    quote, index = lark[start], start + 1
    while index < len(lark) and lark[index] not in (quote, "\n"):
        index += 2 if lark[index] == "\\" else 1
    return index + 1


def refuse_token_ids(lark: str, kind: str) -> None:
    """ConstraintError naming the token-id references in `lark`: a grammar forces a special
    token only by a name it declares."""
    references = token_id_references(lark)
    if references:
        raise ConstraintError(f"the {kind} refers to tokens by id ({', '.join(references)}); "
                              f"name each special token instead (<|channel|>) and declare "
                              f"it: {DECLARE_HINT}")


def hint_for(message: str) -> str:
    """llguidance's refusal, with how to declare a special token where it names one."""
    if UNKNOWN_SPECIAL not in message:
        return message
    return (f"{message.split(';', 1)[0]}; a grammar that names special tokens declares them: "
            f"{DECLARE_HINT}")
