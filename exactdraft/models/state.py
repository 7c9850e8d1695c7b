"""One sequence's state in a DecoderModel: the KV caches of its attention layers, each
recurrent layer's state with the snapshots that roll it back, and what drafters read.

Invariant: after any sequence of passes and truncations a state holds exactly what serial
steps over its tokens leave. Attention layers' KV caches truncate by length. Recurrent states
are never changed in place, so the snapshot after each of the latest `rollback_window`
positions is a reference, not a copy; restore(L) brings back the one at L when it is held (every
length inside the last verify pass is), and otherwise reports that the tokens must be replayed
from the empty state (the model does it; the chunked-prefill invariant makes that exact). A
state that logs no tokens (its model exports KV prefixes, so a prefix can arrive by import) has
no recurrent layers and always restores.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from exactdraft.models.cache import KVCache


class SequenceState:
    """One sequence: its KV caches, recurrent states and snapshots, the token log (None when
    the model keeps none), the token tree held until commit_tree, and (for an MTP drafter) the
    final hidden rows of positions not yet taken."""

    def __init__(self, cache: KVCache, empty: Sequence[Any], rollback_window: int,
                 log_tokens: bool = True) -> None:
        self.cache = cache
        self.empty = tuple(empty)
        self.rollback_window = rollback_window
        self.tokens: list[int] | None = [] if log_tokens else None
        self.recurrent: list[Any] = list(self.empty)
        self.snapshots: dict[int, tuple[Any, ...]] = {0: self.empty}
        # (base, parents) of the token tree the cache holds past base, until it is committed.
        self.tree: tuple[int, list[int]] | None = None
        self.hidden_start = 0  # position of the first row in `hidden`
        self.hidden: list[np.ndarray] = []  # blocks of final hidden rows, in position order

    @property
    def length(self) -> int:
        return self.cache.length

    def reset(self) -> None:
        """Back to the empty sequence."""
        if self.tokens is not None:
            self.tokens = []
        self.cache.truncate(0)
        self.recurrent = list(self.empty)
        self.snapshots = {0: self.empty}
        self.tree = None
        self.hidden_start, self.hidden = 0, []

    def commit(self, start: int, tokens: Sequence[int], keep_from: int,
               row_states: Sequence[Sequence[Any]]) -> None:
        """Record a pass of len(tokens) rows at `start`: row_states[slot][r - keep_from] is
        slot's state after row r, for the rows r >= keep_from."""
        if self.tokens is not None:
            self.tokens.extend(int(t) for t in tokens)
        self.cache.length = start + len(tokens)
        if not self.empty:
            return
        for row in range(keep_from, len(tokens)):
            self.snapshots[start + row + 1] = tuple(states[row - keep_from]
                                                    for states in row_states)
        oldest = self.length - self.rollback_window
        for position in [p for p in self.snapshots if 0 < p < oldest]:
            del self.snapshots[position]

    def restore(self, length: int) -> bool:
        """Cut to `length` from a held snapshot; False if none is held (the caller replays)."""
        if self.empty and length not in self.snapshots:
            return False
        if self.tokens is not None:
            del self.tokens[length:]
        self.cache.truncate(length)
        if self.empty:
            self.recurrent = list(self.snapshots[length])
            for position in [p for p in self.snapshots if p > length]:
                del self.snapshots[position]
        self.trim_hidden(length)
        return True

    def keep_path(self, base: int, path: Sequence[int]) -> None:
        """After the KV rows of a token tree's path moved to base..: forget the rest of the
        tree, the token log following the path."""
        if self.tokens is not None:
            tree_tokens = self.tokens[base:]
            self.tokens[base:] = [tree_tokens[row] for row in path]
        self.tree = None
        self.cache.truncate(base + len(path))
        self.trim_hidden(base)

    def log_hidden(self, start: int, rows: np.ndarray) -> None:
        if not self.hidden:
            self.hidden_start = start
        self.hidden.append(np.array(rows, dtype=np.float32))

    def trim_hidden(self, length: int) -> None:
        kept, position = [], self.hidden_start
        for block in self.hidden:
            if position >= length:
                break
            kept.append(block[:length - position])
            position += block.shape[0]
        self.hidden = kept

    def take_hidden(self, begin: int, end: int) -> np.ndarray | None:
        """The final hidden rows of positions [begin, end), or None if they are not all held;
        rows before `begin` are let go."""
        if not self.hidden or begin < self.hidden_start:
            return None
        rows = np.concatenate(self.hidden) if len(self.hidden) > 1 else self.hidden[0]
        rows = rows[begin - self.hidden_start:]
        self.hidden_start, self.hidden = begin, [rows]
        return rows[:end - begin] if rows.shape[0] >= end - begin else None
