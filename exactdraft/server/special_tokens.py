"""The special tokens a request's grammar names: `{"grammar": ..., "special_tokens": [...]}` in
the `constraint` field, as Constraint.grammar(..., special_tokens=...) takes them.

Invariant: a request's declared special tokens reach the engine only checked, each refusal a
FieldRefusal naming its field (server/fields.py answers it as a RequestError, a 400):
`constraint.special_tokens` for a value that is not a list, or that comes with a kind that
names no special tokens (constraints/kinds.py's names_special_tokens);
`constraint.special_tokens[i]` for an entry that is not a token name, and for one the served
model's tokenizer does not have as a special token (checked before the grammar is compiled for
it). This module sits below fields.py, which calls it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exactdraft.errors import ConstraintError, ParameterError, TokenizerError

# The key of the `constraint` object that declares the grammar's special tokens.
KEY = "special_tokens"
FIELD = f"constraint.{KEY}"


class FieldRefusal(ParameterError):
    """A declared special token, or the declaration, refused: `field` names it as the client
    wrote it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def declared_special_tokens(extension: Mapping[str, Any], kind: str) -> tuple[str, ...]:
    """The special tokens `extension` (the request's `constraint` object, whose constraint
    is of `kind`) declares, in the request's order (so an index names the request's entry);
    () where it declares none (no key, null as the server reads any field, or an empty list),
    with any kind."""
    from exactdraft.constraints.kinds import BY_NAME, KINDS
    from exactdraft.constraints.special_tokens import is_token_name

    names = extension.get(KEY)
    if names is None or names == []:  # null and an empty list both declare none
        return ()
    if not BY_NAME[kind].names_special_tokens:
        takers = " or ".join(k.name for k in KINDS if k.names_special_tokens)
        raise FieldRefusal(f"{FIELD}: a {kind} constraint names no special tokens; "
                           f"{KEY} goes with {takers}", FIELD)
    if not isinstance(names, list):
        raise FieldRefusal(f"{FIELD} must be a list of special token names such as "
                           f"\"<|channel|>\", got {_shown(names)}", FIELD)
    for index, name in enumerate(names):
        if not is_token_name(name):
            where = f"{FIELD}[{index}]"
            raise FieldRefusal(f"{where} must be a special token's name such as "
                               f"\"<|channel|>\" (no whitespace), got {_shown(name)}",
                               where)
    return tuple(names)


def require_served(names: Sequence[str], tokenizer: Any, where: str,
                   constraint_field: str) -> None:
    """FieldRefusal naming `where[i]` for the first of `names` that `tokenizer` (the served
    model's) does not have as a special token; a tokenizer the constraints cannot read is
    refused naming `constraint_field`."""
    from exactdraft.constraints.special_tokens import special_names
    from exactdraft.constraints.tokens import bridge_for

    try:
        have = special_names(bridge_for(tokenizer))
    except (ConstraintError, TokenizerError) as error:
        reason = str(error).splitlines()[0]
        raise FieldRefusal(f"{constraint_field}: {reason}", constraint_field) from None
    for index, name in enumerate(names):
        if name not in have:
            raise FieldRefusal(f"{where}[{index}]: the served model's tokenizer has no "
                               f"special token {name}", f"{where}[{index}]")


def request_wording(reason: str) -> str:
    """A constraint's refusal with the Python API's way to declare special tokens said as a
    request says it."""
    from exactdraft.constraints.special_tokens import DECLARE_HINT

    return reason.replace(DECLARE_HINT, f"{FIELD}, a list beside the grammar")


def _shown(value: Any, limit: int = 80) -> str:
    """A client's value for an error message: repr, cut at `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
