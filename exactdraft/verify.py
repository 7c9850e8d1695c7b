"""The Verifier protocol and ExactVerifier: keep a draft only if it is the target's own sample.

Invariant: the tokens a verdict reports (the kept drafts, then `token`) are exactly the tokens
serial decoding writes at those positions. A verifier judges the rows of a pass it is given and
runs nothing itself. Row 0 is the last committed token's row; row i + 1 belongs to draft i,
whose parent is row i for a chain, or the row its tree parent gives. The walk starts at row 0,
draws the target's keyed sample from the row at the row's own position with the row's own path
as history, and moves to the child that holds that sample, if any. So every kept token is the
target's sample given the tokens before it, siblings never influence a sample, and a chain is a
tree whose every node has one child: both go through the same walk.

The per-row transform point: before a row is drawn from, `transform(row, history)` may change it
(a constraint's mask, a user's logits processor). It is a pure function of the row and the
tokens before the row's position, and it is applied in exactly the same place for a serial step
(a pass with no drafts) and for every row of a verify pass, so drafts change speed only. The
rows a verdict reports are the rows as drawn from (transformed), for logprobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from exactdraft.errors import ParameterError
from exactdraft.sampling.keyed import KeyedSampler
from exactdraft.sampling.params import SamplingParams


class NothingAllowed(Exception):  # noqa: N818 - a signal between a transform and the walk
    """Raised by a row transform when no token may follow the history it was given (an
    unsatisfiable constraint state): the walk ends at the token before that row."""


@runtime_checkable
class RowTransform(Protocol):
    def __call__(self, row: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """The float32 row to draw the token at position len(history) from, given the raw row
        and every token before that position; a pure function of the two. Raises
        NothingAllowed where no token may come at that position."""


@dataclass(frozen=True)
class Verdict:
    kept: list[int]  # the drafts kept, in order along the path
    token: int  # the target's own sample after them
    path: list[int]  # pass rows the committed tokens were drawn from: 0, then each kept draft's
    rows: list[np.ndarray]  # those rows as drawn from (after the transform), one per path row

    @property
    def accepted(self) -> int:
        return len(self.kept)

    @property
    def tokens(self) -> list[int]:
        """The tokens to commit: the kept drafts, then the target's token."""
        return [*self.kept, self.token]


@runtime_checkable
class Verifier(Protocol):
    def verify(self, rows: np.ndarray, drafts: Sequence[int], *,
               parents: Sequence[int] | None = None, sampler: KeyedSampler,
               params: SamplingParams, history: Sequence[int], n_prompt: int,
               transform: RowTransform | None = None) -> Verdict:
        """Judge the rows of a pass over [history[-1], *drafts]: rows[0] belongs to
        history[-1], rows[i + 1] to drafts[i]; `parents[i]` is draft i's parent draft (-1:
        under history[-1]), None for a chain. `history` is the committed sequence."""


def tree_rows(last_token: int, drafts: Sequence[int],
              parents: Sequence[int] | None) -> tuple[list[int], list[int]]:
    """The pass's tokens and each row's parent row: row 0 the last committed token, row i + 1
    draft i (under row parents[i] + 1; for a chain, under row i)."""
    parents = range(-1, len(drafts) - 1) if parents is None else parents
    if len(parents) != len(drafts):
        raise ParameterError(f"{len(drafts)} drafts need as many parents, got {len(parents)}")
    return [int(last_token), *drafts], [-1, *(int(parent) + 1 for parent in parents)]


class ExactVerifier:
    """Accept-while-equal verification against the target's keyed samples (module docstring)."""

    def verify(self, rows: np.ndarray, drafts: Sequence[int], *,
               parents: Sequence[int] | None = None, sampler: KeyedSampler,
               params: SamplingParams, history: Sequence[int], n_prompt: int,
               transform: RowTransform | None = None) -> Verdict:
        tokens, row_parents = tree_rows(history[-1], drafts, parents)
        if len(rows) < (len(tokens) if drafts else 1):
            raise ValueError(f"a pass over {len(tokens)} tokens needs as many rows, got "
                             f"{len(rows)}")
        children: dict[int, dict[int, int]] = {}
        for row in range(1, len(tokens)):
            # Of two siblings with the same token the first listed is taken; both would be kept
            # alike, so the choice changes no token.
            children.setdefault(row_parents[row], {}).setdefault(tokens[row], row)
        path, kept, drawn, past, row = [0], [], [], list(history), 0
        while True:
            try:
                x = rows[row] if transform is None else transform(rows[row], past)
            except NothingAllowed:
                if not kept:  # the committed sequence itself allows nothing: not a pass to judge
                    raise
                # The last kept draft was the target's sample; nothing may follow it, so it is
                # this pass's token, as it would be in a serial step.
                return Verdict(kept=kept[:-1], token=kept[-1], path=path[:-1], rows=drawn)
            drawn.append(x)
            token = sampler.sample(x, params, pos=len(past), history=past, n_prompt=n_prompt)
            child = children.get(row, {}).get(token)
            if child is None:
                return Verdict(kept=kept, token=token, path=path, rows=drawn)
            kept.append(token)
            past.append(token)
            path.append(child)
            row = child
