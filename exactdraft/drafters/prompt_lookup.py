"""PromptLookup: drafts by copying what followed the latest earlier occurrence of the suffix.

Invariant: proposals depend only on the committed sequence (prompt plus output), which is the
same in drafted and serial runs; the n-gram index is rebuilt per generation and only grows as
tokens are committed, so it never holds a token that was not written.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from exactdraft.drafters.base import DraftContext, DraftTree

# The most recent occurrences of an n-gram a tree is built from.
_TREE_OCCURRENCES = 16


class PromptLookup:
    """N-gram copy drafter over prompt and output (no model needed).

    The longest suffix of `max_match` down to `min_match` tokens that occurred earlier is
    matched, and up to `max_draft` tokens that followed its latest earlier occurrence are
    proposed. With `tree_width` > 1 it proposes a DraftTree instead, built from the
    continuations of the latest occurrences of that suffix: up to `tree_width` alternatives
    per node, the most frequent first (the latest occurrence's continuation is its first path).
    """

    # Its whole state is plain data: the engine drafts each sequence with its own copy.
    copies_per_sequence = True

    def __init__(self, max_draft: int = 8, min_match: int = 2, max_match: int = 8,
                 tree_width: int = 1) -> None:
        if isinstance(max_draft, bool) or not isinstance(max_draft, int) or max_draft < 1:
            raise ValueError(f"max_draft must be an integer >= 1, got {max_draft!r}")
        if not isinstance(min_match, int) or min_match < 1:
            raise ValueError(f"min_match must be an integer >= 1, got {min_match!r}")
        if not isinstance(max_match, int) or max_match < min_match:
            raise ValueError(f"max_match must be an integer >= min_match ({min_match}), "
                             f"got {max_match!r}")
        if isinstance(tree_width, bool) or not isinstance(tree_width, int) or tree_width < 1:
            raise ValueError(f"tree_width must be an integer >= 1, got {tree_width!r}")
        self.max_draft = max_draft
        self.min_match = min_match
        self.max_match = max_match
        self.tree_width = tree_width
        # n-gram -> where it started, latest last (only the latest for chains).
        self._starts: dict[tuple[int, ...], deque[int]] = {}
        self._indexed = 0  # sequence[:_indexed] is in _latest

    def __repr__(self) -> str:
        width = f", tree_width={self.tree_width}" if self.tree_width > 1 else ""
        return (f"PromptLookup(max_draft={self.max_draft}, min_match={self.min_match}, "
                f"max_match={self.max_match}{width})")

    def begin(self, prompt: Sequence[int], context: DraftContext) -> None:
        self._reset()

    def _reset(self) -> None:
        self._starts = {}
        self._indexed = 0

    def _index(self, sequence: Sequence[int]) -> None:
        """Record, for every n-gram that now has a follower, where it last started."""
        keep = _TREE_OCCURRENCES if self.tree_width > 1 else 1
        for end in range(max(self._indexed, 1), len(sequence)):
            # The n-grams ending just before `end` are followed by sequence[end].
            for n in range(self.min_match, min(self.max_match, end) + 1):
                key = tuple(sequence[end - n:end])
                starts = self._starts.get(key)
                if starts is None:
                    starts = self._starts[key] = deque(maxlen=keep)
                starts.append(end - n)
        self._indexed = max(self._indexed, len(sequence))

    def propose(self, sequence: Sequence[int], limit: int) -> list[int] | DraftTree:
        limit = min(limit, self.max_draft)
        if limit <= 0:
            return []
        if len(sequence) < self._indexed:
            self._reset()  # a different, shorter sequence: start over
        self._index(sequence)
        for n in range(min(self.max_match, len(sequence) - 1), self.min_match - 1, -1):
            starts = self._starts.get(tuple(sequence[len(sequence) - n:]))
            if starts:
                if self.tree_width == 1:
                    return list(sequence[starts[-1] + n:starts[-1] + n + limit])
                continuations = [list(sequence[start + n:start + n + limit])
                                 for start in reversed(starts)]
                return DraftTree.from_continuations(continuations, limit,
                                                    width=self.tree_width)
        return []

    def accepted(self, proposed: int, accepted: int) -> None:
        pass
