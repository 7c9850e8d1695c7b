"""PromptLookup: drafts by copying what followed the latest earlier occurrence of the suffix.

Invariant: proposals depend only on the committed sequence (prompt plus output), which is the
same in drafted and serial runs; the n-gram index is rebuilt per generation and only grows as
tokens are committed, so it never holds a token that was not written.
"""

from __future__ import annotations

from collections.abc import Sequence

from exactdraft.drafters.base import DraftContext


class PromptLookup:
    """N-gram copy drafter over prompt and output (no model needed).

    The longest suffix of `max_match` down to `min_match` tokens that occurred earlier is
    matched, and up to `max_draft` tokens that followed its latest earlier occurrence are
    proposed.
    """

    def __init__(self, max_draft: int = 8, min_match: int = 2, max_match: int = 8) -> None:
        if isinstance(max_draft, bool) or not isinstance(max_draft, int) or max_draft < 1:
            raise ValueError(f"max_draft must be an integer >= 1, got {max_draft!r}")
        if not isinstance(min_match, int) or min_match < 1:
            raise ValueError(f"min_match must be an integer >= 1, got {min_match!r}")
        if not isinstance(max_match, int) or max_match < min_match:
            raise ValueError(f"max_match must be an integer >= min_match ({min_match}), "
                             f"got {max_match!r}")
        self.max_draft = max_draft
        self.min_match = min_match
        self.max_match = max_match
        self._latest: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # sequence[:_indexed] is in _latest

    def __repr__(self) -> str:
        return (f"PromptLookup(max_draft={self.max_draft}, min_match={self.min_match}, "
                f"max_match={self.max_match})")

    def begin(self, prompt: Sequence[int], context: DraftContext) -> None:
        self._reset()

    def _reset(self) -> None:
        self._latest = {}
        self._indexed = 0

    def _index(self, sequence: Sequence[int]) -> None:
        """Record, for every n-gram that now has a follower, where it last started."""
        for end in range(max(self._indexed, 1), len(sequence)):
            # The n-grams ending just before `end` are followed by sequence[end].
            for n in range(self.min_match, min(self.max_match, end) + 1):
                self._latest[tuple(sequence[end - n:end])] = end - n
        self._indexed = max(self._indexed, len(sequence))

    def propose(self, sequence: Sequence[int], limit: int) -> list[int]:
        limit = min(limit, self.max_draft)
        if limit <= 0:
            return []
        if len(sequence) < self._indexed:
            self._reset()  # a different, shorter sequence: start over
        self._index(sequence)
        for n in range(min(self.max_match, len(sequence) - 1), self.min_match - 1, -1):
            start = self._latest.get(tuple(sequence[len(sequence) - n:]))
            if start is not None:
                return list(sequence[start + n:start + n + limit])
        return []

    def accepted(self, proposed: int, accepted: int) -> None:
        pass
