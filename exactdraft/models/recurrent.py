"""What the recurrent layers (Gated DeltaNet, Mamba-2) share: host arithmetic in one fixed order,
the causal depthwise convolution with its state, and the per-sequence state that rolls back
exactly.

Invariant: a recurrent layer's bits for a row depend on that row and the state it starts from
only, and a sequence's state after position p is the same object however the positions before
it were cut into passes; so a W-row verify pass gives every row the bits of W single steps,
prefill in any chunking leaves the same state, and truncating to a length restores exactly the
state serial decoding has there.

The host arithmetic behind that:
- float32 +, *, / and sqrt on numpy arrays, elementwise (IEEE, correctly rounded, no fused
  multiply-add, so the same bits on every machine numpy runs on);
- reductions along one axis with `tree_sum` only: a fixed pairwise tree (element i meets
  element i + n/2, halving, a zero appended when the count is odd), never numpy's sum, whose
  blocking may vary;
- exp, log, sigmoid, softplus and silu through exactdraft.float64_math in float64, rounded to
  float32 once (numpy's and libm's float32 transcendentals differ between CPUs);
- the recurrences run token by token in the serial order, in the same code for every pass
  size, and no layer ever changes a state array in place: each step makes new arrays.

Rollback: HybridState keeps, for the latest `rollback_window` positions, the recurrent state
after each position (references to those never-mutated arrays, so keeping them costs no copy).
truncate(L) restores the snapshot at L when it is held (every length inside the last verify
pass is); for an older L it replays the kept tokens from the empty state, which by the
chunked-prefill invariant gives the same bits (the cost of a prefill). Attention layers' KV
caches truncate by length as everywhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from exactdraft import float64_math
from exactdraft.models.cache import KVCache

F32 = np.float32


def tree_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """The sum along `axis` (0 or -1) by a fixed pairwise tree: with n entries (a zero
    appended if n is odd), entry i is added to entry i + n / 2, and so on until one is left."""
    x = np.asarray(x)
    last = axis in (-1, x.ndim - 1)
    if not last and axis != 0:
        raise ValueError(f"tree_sum reduces axis 0 or the last axis, not {axis}")
    count = x.shape[-1] if last else x.shape[0]
    while count > 1:
        if count % 2:
            pad = np.zeros_like(x[..., :1] if last else x[:1])
            x = np.concatenate([x, pad], axis=-1 if last else 0)
            count += 1
        count //= 2
        x = x[..., :count] + x[..., count:] if last else x[:count] + x[count:]
    return x[..., 0] if last else x[0]


def rms_normalized(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x * x) + eps) over the last axis, float32, mean by tree_sum."""
    x = np.asarray(x, dtype=F32)
    mean = tree_sum(x * x, -1) / F32(x.shape[-1])
    return x * (F32(1.0) / np.sqrt(mean + F32(eps)))[..., None]


def l2_normalized(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum(x * x) + eps) over the last axis, float32, sum by tree_sum."""
    x = np.asarray(x, dtype=F32)
    return x * (F32(1.0) / np.sqrt(tree_sum(x * x, -1) + F32(eps)))[..., None]


def sigmoid32(x: np.ndarray) -> np.ndarray:
    return float64_math.sigmoid(x).astype(F32)


def silu32(x: np.ndarray) -> np.ndarray:
    wide = np.asarray(x, dtype=np.float64)
    return (wide * float64_math.sigmoid(wide)).astype(F32)


def causal_conv(previous: np.ndarray, rows: np.ndarray, weight: np.ndarray,
                bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal convolution of rows [M, C] that follow the inputs `previous` [K-1, C],
    with weight [K, C] (tap j multiplies the input K-1-j steps back): returns the outputs
    [M, C] (taps added in order j = 0..K-1, then the bias) and the inputs window [K-1+M, C],
    whose rows t+1 .. t+K-1 are the convolution's state after row t."""
    window = np.concatenate([previous, np.asarray(rows, dtype=F32)])
    taps, count = weight.shape[0], rows.shape[0]
    out = window[0:count] * weight[0]
    for tap in range(1, taps):
        out = out + window[tap:tap + count] * weight[tap]
    if bias is not None:
        out = out + bias
    return out, window


class HybridState:
    """One sequence: its tokens, the KV caches of the attention layers, each recurrent layer's
    current state, the snapshots that roll them back, and (for an MTP drafter) the final hidden
    rows of positions not yet taken."""

    def __init__(self, cache: KVCache, empty: Sequence[Any], rollback_window: int) -> None:
        self.cache = cache
        self.empty = tuple(empty)
        self.rollback_window = rollback_window
        self.tokens: list[int] = []
        self.recurrent: list[Any] = list(self.empty)
        self.snapshots: dict[int, tuple[Any, ...]] = {0: self.empty}
        self.hidden_start = 0  # position of the first row in `hidden`
        self.hidden: list[np.ndarray] = []  # blocks of final hidden rows, in position order

    @property
    def length(self) -> int:
        return len(self.tokens)

    def reset(self) -> None:
        """Back to the empty sequence."""
        self.tokens = []
        self.cache.truncate(0)
        self.recurrent = list(self.empty)
        self.snapshots = {0: self.empty}
        self.hidden_start, self.hidden = 0, []

    def commit(self, start: int, tokens: Sequence[int], keep_from: int,
               row_states: Sequence[Sequence[Any]]) -> None:
        """Record a pass of len(tokens) rows at `start`: row_states[slot][r - keep_from] is
        slot's state after row r, for the rows r >= keep_from."""
        self.tokens.extend(int(t) for t in tokens)
        self.cache.length = self.length
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
        del self.tokens[length:]
        self.cache.truncate(length)
        if self.empty:
            self.recurrent = list(self.snapshots[length])
            for position in [p for p in self.snapshots if p > length]:
                del self.snapshots[position]
        self.trim_hidden(length)
        return True

    def log_hidden(self, start: int, rows: np.ndarray) -> None:
        if not self.hidden:
            self.hidden_start = start
        self.hidden.append(np.array(rows, dtype=F32))

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
