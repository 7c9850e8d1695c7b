"""The Verifier protocol and ExactVerifier: accept a draft only if it is the target's own sample.

Invariant: after `verify`, the tokens it reports (the kept drafts, then `token`) are exactly the
tokens serial decoding writes at those positions, and the target's state holds the committed
sequence and nothing more. A draft is kept iff it equals the target's keyed sample at its
position given the drafts before it; the first mismatch is replaced by that sample, and if every
draft is kept the sample after the last one is the bonus token. Drafts therefore change how many
target passes a generation takes, never what it writes.

A pass may also be run before the verifier sees it (by the Generator, or in a pass shared by
several sequences): ComputedPass hands a verifier those rows as the target's answer to the very
pass it asks for, so every verifier keeps its protocol and its semantics whoever ran the pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from exactdraft.models.target import Rows, Target
from exactdraft.sampling import KeyedSampler, SamplingParams


@dataclass(frozen=True)
class Verdict:
    accepted: int  # how many drafts were kept
    token: int  # the target's own sample after the kept drafts


@runtime_checkable
class Verifier(Protocol):
    def verify(self, target: Target, state: Any, drafts: Sequence[int], *,
               sampler: KeyedSampler, params: SamplingParams, history: Sequence[int],
               n_prompt: int) -> Verdict:
        """Run the target over [history[-1], *drafts] (the target's state holds history[:-1]),
        decide, and truncate the state to the committed prefix."""


class ExactVerifier:
    """Accept-while-equal verification against the target's keyed samples."""

    def verify(self, target: Target, state: Any, drafts: Sequence[int], *,
               sampler: KeyedSampler, params: SamplingParams, history: Sequence[int],
               n_prompt: int) -> Verdict:
        start = len(history) - 1
        rows = target.forward(state, [history[-1], *drafts], rows="all" if drafts else "last")
        samples = sampler.sample_window(rows, params, pos=len(history), history=history,
                                        n_prompt=n_prompt, drafts=drafts)
        accepted = len(samples) - 1
        target.truncate(state, start + 1 + accepted)
        return Verdict(accepted=accepted, token=samples[-1])


class ComputedPass:
    """A view of `target` whose `forward` returns rows a pass has already computed.

    `tokens` were appended to the state by that pass and `logits` holds its rows: every row
    when `all_rows`, else the last row only. A verifier asking for any other pass, or for rows
    the pass did not keep, gets a ValueError instead of rows that belong to something else.
    Everything but `forward` (truncate, vocab_size, ...) is the target's own."""

    def __init__(self, target: Target, tokens: Sequence[int], logits: np.ndarray,
                 all_rows: bool) -> None:
        self.target = target
        self.tokens = list(tokens)
        self.logits = logits  # [len(tokens) or 1, vocab] float32
        self.all_rows = all_rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)

    def forward(self, state: Any, tokens: Sequence[int], rows: Rows = "last") -> np.ndarray:
        if list(tokens) != self.tokens:
            raise ValueError(f"the verifier asked for a pass over {list(tokens)}, but the pass "
                             f"that ran appended {self.tokens}")
        if rows == "last":
            return self.logits[-1:]
        if not self.all_rows and len(self.tokens) > 1:
            raise ValueError("the verifier asked for every row of a pass that kept the last row")
        return self.logits
