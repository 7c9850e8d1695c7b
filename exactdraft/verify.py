"""The Verifier protocol and ExactVerifier: accept a draft only if it is the target's own sample.

Invariant: after `verify`, the tokens it reports (the kept drafts, then `token`) are exactly the
tokens serial decoding writes at those positions, and the target's state holds the committed
sequence and nothing more. A draft is kept iff it equals the target's keyed sample at its
position given the drafts before it; the first mismatch is replaced by that sample, and if every
draft is kept the sample after the last one is the bonus token. Drafts therefore change how many
target passes a generation takes, never what it writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from exactdraft.models.target import Target
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
