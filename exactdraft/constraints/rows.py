"""A constraint inside the decoding loop: its mask as the Verifier's row transform, drafts cut to
what it allows, and the tokens it forces proposed as drafts.

Invariant: the mask applied to the row of position p is the matcher's mask after exactly the
tokens generated before p (SAMPLER.md, Constraints), whichever pass holds the row: the serial
step at p, or any row of a verify pass whose path reaches p. `ConstraintRows` brings its one
matcher to a row's prefix (rolling back and consuming the difference) before it answers, so its
answer is a function of that prefix alone, never of the order in which rows were asked about.
Cutting drafts and proposing forced tokens only choose which rows a pass holds: every kept token
is still the keyed sample of its masked row, so they change speed, never tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from exactdraft.errors import ParameterError
from exactdraft.verify import NothingAllowed

# With no drafter, the most forced tokens one pass verifies (the guard proves that window).
FORCED_WINDOW = 8


def matcher_for(constraint: Any, tokenizer: Any, vocab_size: int,
                stop_token_ids: Sequence[int]) -> Any:
    """A fresh matcher for one generation: `constraint` is a Constraint, a JSON schema (dict),
    a pydantic model class or a list of choices. ParameterError (ConstraintError) naming what
    is wrong; nothing runs."""
    from exactdraft.constraints.constraint import Constraint

    if tokenizer is None:
        raise ParameterError("a constraint needs the model's tokenizer (load the model with "
                             "Generator.from_pretrained, or pass tokenizer=)")
    if isinstance(constraint, dict) or isinstance(constraint, type):
        constraint = Constraint.json_schema(constraint)
    elif isinstance(constraint, (list, tuple)) and all(isinstance(c, str) for c in constraint):
        constraint = Constraint.choices(constraint)
    if not isinstance(constraint, Constraint):
        raise ParameterError(f"constraint must be an exactdraft.Constraint, a JSON schema dict, "
                             f"a pydantic model class or a list of strings, got "
                             f"{type(constraint).__name__}")
    return constraint.matcher(tokenizer, vocab_size, stop_token_ids)


class ConstraintRows:
    """A ConstraintMatcher (exactdraft.constraints) seen as a RowTransform for one generation
    whose first `n_prompt` tokens are the prompt."""

    def __init__(self, matcher: Any, n_prompt: int) -> None:
        self.matcher = matcher
        self.n_prompt = n_prompt
        # A row of -inf to copy: the masked row where few ids are allowed (never written).
        self._blank = np.full(matcher.vocab_size, -np.inf, dtype=np.float32)
        self._blank.flags.writeable = False

    def __call__(self, row: np.ndarray, history: Sequence[int]) -> np.ndarray:
        matcher = self.at(history[self.n_prompt:])
        if not matcher.any_allowed:
            raise NothingAllowed(f"the constraint allows no token at position {len(history)}")
        return self._apply_mask(np.asarray(row), matcher)

    def _apply_mask(self, row: np.ndarray, matcher: Any) -> np.ndarray:
        # constraints.apply_mask without its checks: the mask is the matcher's own and allows
        # something (checked above). Each way gives the same fresh row, the row's float32
        # values at the allowed ids and -inf elsewhere, in work that scales with the fewer of
        # the allowed and the forbidden ids where those are few.
        if row.shape == self._blank.shape:
            ids = matcher.allowed_ids()
            if ids is not None:
                masked = self._blank.copy()
                masked[ids] = row[ids]
                return masked
            banned = matcher.forbidden_ids()
            if banned is not None:
                masked = np.array(row, dtype=np.float32)  # a copy, always
                masked[banned] = -np.inf
                return masked
        return np.where(matcher.allowed(), np.asarray(row, dtype=np.float32),
                        np.float32(-np.inf))

    def at(self, output: Sequence[int]) -> Any:
        """The matcher after exactly `output` (the generated tokens of a prefix)."""
        matcher = self.matcher
        held = matcher.consumed
        if len(output) == len(held) and output == held:  # usually: a list equal to the list
            return matcher
        common = min(len(held), len(output))
        # The prefixes usually agree but for the last few tokens: compare whole first.
        if list(output[:common]) != held[:common]:
            same = 0
            while held[same] == output[same]:
                same += 1
            common = same
        matcher.rollback(len(held) - common)
        for token in output[common:]:
            matcher.consume(token)
        return matcher

    def cut(self, output: Sequence[int], drafts: Sequence[int]) -> list[int]:
        """The leading drafts the constraint allows after `output` (the rest would only be
        rows whose tokens can never be kept)."""
        return list(drafts[:self.at(output).valid_prefix(drafts)])

    def forced(self, output: Sequence[int], limit: int) -> list[int]:
        """Tokens the constraint forces after `output`, as drafts (at most `limit`)."""
        return self.at(output).forced(limit) if limit > 0 else []

    def ended(self, output: Sequence[int]) -> str | None:
        """Where no token may follow `output` (and no stop token ended it), the finish reason:
        "stop" for a complete match that nothing may extend (no stop token is allowed to end
        it), "unsatisfiable" for an incomplete one; else None."""
        matcher = self.at(output)
        if matcher.stopped or matcher.any_allowed:
            return None
        return "stop" if matcher.complete else "unsatisfiable"

    def complete(self, output: Sequence[int]) -> bool:
        return self.at(output).complete
