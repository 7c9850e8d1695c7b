"""SuffixDrafter: drafts what followed the longest earlier match of the sequence's suffix, in
this generation and in earlier ones of the same drafter.

Invariant: proposals depend only on token sequences this drafter was shown (prompts and
committed outputs), never on the target, so they change how many passes a run takes and never
its tokens. Memory is bounded: earlier outputs are kept up to `max_stored_tokens` in all, the
least recently used (stored or matched) dropped first, and each index list keeps only its
most recent `max_candidates` positions.

How it drafts (the idea of SuffixDecoding): the current sequence's suffix is matched against
the prompt, the output so far and earlier outputs, and the longest match length p found sets
how far to speculate (`speculation_factor * p` tokens, at most `max_draft`): a long match
predicts a long copy, a short one little. The continuations after every occurrence of that
longest match are counted in a small trie, and the draft follows the most frequent branch
while its estimated probability (occurrences along the branch / occurrences of the match)
stays at or above `min_probability`. With `tree_width` > 1 it proposes a tree instead: the
most probable nodes of that trie, up to `tree_width` alternatives per node.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence

from exactdraft.drafters.base import DraftContext, DraftTree


class _Document:
    """A token sequence with an index from every `anchor`-gram to the positions after it."""

    def __init__(self, anchor: int, max_candidates: int) -> None:
        self.anchor, self.max_candidates = anchor, max_candidates
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], deque[int]] = {}  # anchor-gram -> positions after it

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.tokens.append(int(token))
            end = len(self.tokens) - 1  # the gram ending before `end` is followed by the token
            if end >= self.anchor:
                key = tuple(self.tokens[end - self.anchor:end])
                positions = self.after.get(key)
                if positions is None:
                    positions = self.after[key] = deque(maxlen=self.max_candidates)
                positions.append(end)

    def matches(self, pattern: Sequence[int], limit_end: int) -> list[tuple[int, int]]:
        """(match length, position after the match) for occurrences of the pattern's last
        `anchor` tokens that end before `limit_end`, the length extended backwards as far as
        the pattern and this document agree."""
        key = tuple(pattern[len(pattern) - self.anchor:])
        found = []
        for after in self.after.get(key, ()):
            if after >= limit_end:
                continue
            length = self.anchor
            while (length < len(pattern) and length < after and
                   self.tokens[after - length - 1] == pattern[len(pattern) - length - 1]):
                length += 1
            found.append((length, after))
        return found


class SuffixDrafter:
    """Suffix-match drafter over prompt, output and earlier outputs (no model needed)."""

    # Its whole state is plain data: the engine drafts each sequence with its own copy.
    copies_per_sequence = True

    def __init__(self, max_draft: int = 8, *, max_match: int = 32, min_match: int = 2,
                 speculation_factor: float = 1.0, min_probability: float = 0.1,
                 max_stored_tokens: int = 1 << 16, max_candidates: int = 64,
                 tree_width: int = 1) -> None:
        for name, value, low in (("max_draft", max_draft, 1), ("min_match", min_match, 1),
                                 ("tree_width", tree_width, 1),
                                 ("max_stored_tokens", max_stored_tokens, 0),
                                 ("max_candidates", max_candidates, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if isinstance(max_match, bool) or not isinstance(max_match, int) or \
                max_match < min_match:
            raise ValueError(f"max_match must be an integer >= min_match ({min_match}), "
                             f"got {max_match!r}")
        if not (isinstance(speculation_factor, (int, float)) and speculation_factor > 0):
            raise ValueError(f"speculation_factor must be a number > 0, got "
                             f"{speculation_factor!r}")
        if not (isinstance(min_probability, (int, float)) and 0 <= min_probability <= 1):
            raise ValueError(f"min_probability must be in [0, 1], got {min_probability!r}")
        self.max_draft, self.max_match, self.min_match = max_draft, max_match, min_match
        self.speculation_factor = float(speculation_factor)
        self.min_probability = float(min_probability)
        self.max_stored_tokens, self.max_candidates = max_stored_tokens, max_candidates
        self.tree_width = tree_width
        # Earlier outputs, least recently used first: id -> document.
        self._earlier: OrderedDict[int, _Document] = OrderedDict()
        self._stored_tokens = 0
        self._next_id = 0
        self._current = _Document(min_match, max_candidates)
        self._n_prompt = 0

    def __repr__(self) -> str:
        return (f"SuffixDrafter(max_draft={self.max_draft}, max_match={self.max_match}, "
                f"stored={len(self._earlier)} outputs/{self._stored_tokens} tokens)")

    @property
    def stored_tokens(self) -> int:
        return self._stored_tokens

    def begin(self, prompt: Sequence[int], context: DraftContext) -> None:
        self._store_output()
        self._current = _Document(self.min_match, self.max_candidates)
        self._current.extend(prompt)
        self._n_prompt = len(prompt)

    def remember(self, tokens: Sequence[int]) -> None:
        """Add a sequence (an earlier output, a document the outputs will copy from) to the
        store of earlier outputs."""
        tokens = [int(t) for t in tokens][-self.max_stored_tokens:] \
            if self.max_stored_tokens else []
        if len(tokens) <= self.min_match:
            return
        document = _Document(self.min_match, self.max_candidates)
        document.extend(tokens)
        self._earlier[self._next_id] = document
        self._next_id += 1
        self._stored_tokens += len(tokens)
        while self._stored_tokens > self.max_stored_tokens:
            _, dropped = self._earlier.popitem(last=False)
            self._stored_tokens -= len(dropped.tokens)

    def _store_output(self) -> None:
        self.remember(self._current.tokens[self._n_prompt:])

    def _follow(self, sequence: Sequence[int]) -> None:
        """Bring the current document in step with the committed sequence."""
        current = self._current.tokens
        if len(sequence) < len(current) or \
                (current and sequence[len(current) - 1] != current[-1]):
            # Not a continuation of what was shown: start over from this sequence.
            self._current = _Document(self.min_match, self.max_candidates)
            self._n_prompt = min(self._n_prompt, len(sequence))
            current = self._current.tokens
        self._current.extend(sequence[len(current):])

    def propose(self, sequence: Sequence[int], limit: int) -> list[int] | DraftTree:
        """A chain, or with tree_width > 1 a DraftTree of up to `limit` nodes (each at most
        speculation_factor * match length deep)."""
        limit = min(limit, self.max_draft)
        if limit <= 0 or len(sequence) <= self.min_match:
            return []
        self._follow(sequence)
        pattern = list(sequence[max(0, len(sequence) - self.max_match):])
        # Most recent first (the current document, latest occurrence first, then earlier
        # outputs, most recently used first), so equal counts go to the most recent copy.
        occurrences = [(length, None, self._current, after) for length, after in
                       reversed(self._current.matches(pattern, len(sequence)))]
        for key in reversed(self._earlier):
            document = self._earlier[key]
            occurrences += [(length, key, document, after) for length, after in
                            reversed(document.matches(pattern, len(document.tokens)))]
        if not occurrences:
            return []
        longest = max(length for length, _, _, _ in occurrences)
        depth = min(limit, max(1, math.ceil(self.speculation_factor * longest)))
        continuations = []
        for length, key, document, after in occurrences:
            if length == longest:
                continuations.append(document.tokens[after:after + depth])
                if key is not None:
                    self._earlier.move_to_end(key)  # matched: used recently
        tree = DraftTree.from_continuations(continuations, limit if self.tree_width > 1 else depth,
                                            self.min_probability, self.tree_width)
        return tree if self.tree_width > 1 else list(tree.tokens)

    def accepted(self, proposed: int, accepted: int) -> None:
        pass
