"""The Drafter protocol: anything that guesses the next tokens of a sequence.

Invariant: a drafter influences speed only. Whatever it proposes, the Verifier keeps a draft
only when it equals the target's own sample, so a drafter may be wrong, slow to adapt or
stateful without any effect on the tokens a generation writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from exactdraft.sampling import KeyedSampler, SamplingParams


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may use to guess like the target: the generation's sampling setup."""

    params: SamplingParams
    sampler: KeyedSampler
    n_prompt: int


@runtime_checkable
class Drafter(Protocol):
    max_draft: int

    def begin(self, prompt: Sequence[int], context: DraftContext) -> None:
        """Start a new generation for this prompt."""

    def propose(self, sequence: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` guesses for the tokens after `sequence` (prompt plus committed
        output); an empty list means a plain serial step."""

    def accepted(self, proposed: int, accepted: int) -> None:
        """Feedback after verification: `accepted` of the `proposed` drafts were kept."""
