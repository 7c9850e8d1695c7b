"""The special tokens a request's grammar names: `{"grammar": ..., "special_tokens": [...]}` in
the `constraint` field, as Constraint.grammar(..., special_tokens=...) takes them.

Invariant: a request's declared special tokens reach the engine only checked, each refusal a
RequestError naming its field: `constraint.special_tokens` for a value that is not a list, or
that comes with a kind that names no special tokens (constraints/kinds.py's
names_special_tokens); `constraint.special_tokens[i]` for an entry that is not a token name,
and for one the served model's tokenizer does not have as a special token (checked before the
grammar is compiled for it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exactdraft.errors import ConstraintError, TokenizerError
from exactdraft.server.fields import RequestError

# The key of the `constraint` object that declares the grammar's special tokens.
KEY = "special_tokens"
FIELD = f"constraint.{KEY}"


def declared_special_tokens(extension: Mapping[str, Any], kind: str) -> tuple[str, ...]:
    """The special tokens `extension` (the request's `constraint` object, whose constraint
    is of `kind`) declares, in the request's order (so an index names the request's entry);
    () where it declares none."""
    from exactdraft.constraints.kinds import BY_NAME, KINDS
    from exactdraft.constraints.special_tokens import is_token_name

    if KEY not in extension:
        return ()
    names = extension[KEY]
    if not BY_NAME[kind].names_special_tokens:
        takers = " or ".join(k.name for k in KINDS if k.names_special_tokens)
        raise RequestError(f"{FIELD}: a {kind} constraint names no special tokens; "
                           f"{KEY} goes with {takers}", FIELD)
    if not isinstance(names, list):
        raise RequestError(f"{FIELD} must be a list of special token names such as "
                           f"\"<|channel|>\", got {_shown(names)}", FIELD)
    for index, name in enumerate(names):
        if not is_token_name(name):
            where = f"{FIELD}[{index}]"
            raise RequestError(f"{where} must be a special token's name such as "
                               f"\"<|channel|>\" (no whitespace), got {_shown(name)}",
                               where)
    return tuple(names)


def require_served(names: Sequence[str], tokenizer: Any, where: str,
                   constraint_field: str) -> None:
    """RequestError naming `where[i]` for the first of `names` that `tokenizer` (the served
    model's) does not have as a special token; a tokenizer the constraints cannot read is
    refused naming `constraint_field`."""
    from exactdraft.constraints.special_tokens import special_names
    from exactdraft.constraints.tokens import bridge_for

    try:
        have = special_names(bridge_for(tokenizer))
    except (ConstraintError, TokenizerError) as error:
        reason = str(error).splitlines()[0]
        raise RequestError(f"{constraint_field}: {reason}", constraint_field) from None
    for index, name in enumerate(names):
        if name not in have:
            raise RequestError(f"{where}[{index}]: the served model's tokenizer has no "
                               f"special token {name}", f"{where}[{index}]")


def _shown(value: Any, limit: int = 80) -> str:
    """A client's value for an error message: repr, cut at `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
