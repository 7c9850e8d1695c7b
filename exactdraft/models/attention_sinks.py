"""Attention with sinks (gpt-oss): a learned logit per query head that joins every row's softmax
denominator and carries no value.

Invariant: a row's attended output has the bits it gets when its sequence runs alone and the row
is computed by itself, on every backend. The keys' weighted sum is the backend's row invariant
attention; the sink then scales it by Z / (Z + exp(sink - m)), Z = sum_j exp(s_j - m) over the
row's visible keys and m the largest of those scores and the sink: the same softmax with the
sink as one more logit, in another order. The scores q . k_j come from the backend's row
invariant linear, the row's query times a block of BLOCK keys (aligned to absolute positions) as
a matrix of a fixed shape; the rest is host float64 per row and head: s_j = scale * q . k_j,
the exp(s_j - m) added in those blocks (tree_sum, masked keys as exact zeros) and the blocks in
position order, so neither the number of rows in the pass nor the cache length changes a row's
Z. The scale is applied to the float32 attended rows in float64 and rounded once.

Token trees: a tree row reads, at each depth past the root, the key of its ancestor there (the
backend's tree attention); its scores are taken from those keys' columns, so the positions it
adds up, and their order, are those of a serial step over its path.

Cost: every score is computed a second time (one small matmul per KV head and key block) and
exp'd on the host in float64 (measured on the 2-core x86 machine, C backend, 64 heads of 64 and
8 KV heads: 14 ms for one row over 2048 keys, 130 ms for 8 rows, 2.5 s for a 512-row prefill
chunk over 512 keys, mostly the exp); a backend attention that also returned each row's
log-sum-exp would remove it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft import float64_math
from exactdraft.backends.base import Backend
from exactdraft.models.blocks import RopeTable
from exactdraft.models.mixers import AttentionMixer, PassContext
from exactdraft.models.recurrent import F32, tree_sum

BLOCK = 256  # keys per score matrix and per block of the sum, aligned to absolute positions
ELEMENTS_PER_GROUP = 1 << 22  # scores of a group of rows (rows are grouped to stay under)


def key_scores(be: Backend, q: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """q . k, float32 [M, Hq, L], for q [M, Hq, D] and keys [Hkv, L, D] (L a multiple of
    BLOCK): per KV head, its query rows times each block of BLOCK keys as a matrix [BLOCK, D],
    through the backend's row invariant linear (a fixed weight shape, so an element's bits
    depend on its query row and key alone)."""
    rows, heads, dim = q.shape
    kv_heads, length = keys.shape[0], keys.shape[1]
    group = heads // kv_heads
    grouped = q.reshape(rows, kv_heads, group, dim)
    scores = np.empty((rows, kv_heads, group, length), F32)
    for head in range(kv_heads):
        x = be.vector(np.ascontiguousarray(grouped[:, head].reshape(rows * group, dim)))
        for start in range(0, length, BLOCK):
            block = be.matrix(np.ascontiguousarray(keys[head, start:start + BLOCK]))
            scores[:, head, :, start:start + BLOCK] = be.to_host(be.linear(x, block)).reshape(
                rows, group, BLOCK)
    return scores.reshape(rows, heads, length)


def sink_scales(be: Backend, q: np.ndarray, keys: np.ndarray, first_key: int,
                positions: np.ndarray, window: int, scale: float, sinks: np.ndarray,
                columns: np.ndarray | None = None) -> np.ndarray:
    """Z / (Z + exp(sink - m)) per row and head, float64 [M, Hq], for queries q [M, Hq, D] at
    `positions` over keys [Hkv, L, D] in slots first_key.. (first_key and L multiples of
    BLOCK, past the last slot any row reads). Position first_key + i of row r is the key in
    column columns[r, i] (default: column i, each position in its own slot)."""
    rows, heads = q.shape[0], q.shape[1]
    length = keys.shape[1]
    key_positions = first_key + np.arange(length)
    visible = key_positions[None, :] <= positions[:, None]
    if window > 0:
        visible &= positions[:, None] - key_positions[None, :] < window
    sink = np.asarray(sinks, dtype=np.float64)
    out = np.empty((rows, heads), np.float64)
    step = max(1, ELEMENTS_PER_GROUP // max(1, heads * length))
    for begin in range(0, rows, step):
        end = min(rows, begin + step)
        scores = key_scores(be, q[begin:end], keys)  # [m, Hq, L] by column
        if columns is not None:
            scores = np.take_along_axis(scores, columns[begin:end, None, :], axis=-1)
        scores = scores.astype(np.float64) * scale  # by position
        seen = visible[begin:end, None, :]
        top = np.maximum(np.where(seen, scores, -np.inf).max(axis=-1), sink[None, :])
        terms = np.where(seen, float64_math.exp(np.where(seen, scores - top[..., None], 0.0)),
                         0.0)
        total = np.zeros(top.shape, np.float64)
        for block in range(0, length, BLOCK):
            total = total + tree_sum(terms[..., block:block + BLOCK], -1)
        out[begin:end] = total / (total + float64_math.exp(sink[None, :] - top))
    return out


def tree_columns(positions: np.ndarray, tree_paths: np.ndarray, first: int, length: int
                 ) -> np.ndarray:
    """[M, length]: for each tree row and position first + i, the column (slot - first) of the
    key it reads there: its own slot before the root, then the slot of its ancestor at each
    depth (tree_paths[r, d], a row of the tree, whose slot is root + that row)."""
    base = int(positions[0])
    columns = np.tile(np.arange(length, dtype=np.int64), (positions.size, 1))
    for row, position in enumerate(positions):
        depths = np.arange(int(position) - base + 1)
        columns[row, base + depths - first] = base + tree_paths[row, depths] - first
    return columns


class _WithSinks:
    """The backend as the wrapped attention mixer sees it: every op its own, attention
    followed by the sink's scale."""

    def __init__(self, backend: Backend, sinks: np.ndarray) -> None:
        self._backend = backend
        self._sinks = sinks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def attention(self, q: Any, keys: Any, values: Any, positions: np.ndarray, window: int,
                  scale: float, tree_paths: np.ndarray | None = None) -> Any:
        be = self._backend
        tree = {} if tree_paths is None else {"tree_paths": tree_paths}
        attended = be.attention(q, keys, values, positions, window, scale, **tree)
        positions = np.asarray(positions, dtype=np.int64)
        # The last slot read: a tree's rows sit in the slots after its root.
        last = int(positions.max()) if tree_paths is None else \
            max(int(positions.max()), int(positions[0]) + len(positions) - 1)
        first = int(positions.min()) - window + 1 if window > 0 else 0
        first = max(0, first) // BLOCK * BLOCK
        end = min((last // BLOCK + 1) * BLOCK, keys.shape[1])
        span = be.to_host(keys[:, first:end])
        padded = np.zeros((span.shape[0], (last // BLOCK + 1) * BLOCK - first, span.shape[2]),
                          F32)
        padded[:, :span.shape[1]] = span
        columns = None if tree_paths is None else \
            tree_columns(positions, np.asarray(tree_paths), first, padded.shape[1])
        scales = sink_scales(be, be.to_host(q), padded, first, positions, window, scale,
                             self._sinks, columns)
        host = be.to_host(attended).astype(np.float64) * scales[..., None]
        return be.vector(host.astype(F32))


@dataclass
class SinkAttention:
    """An AttentionMixer whose heads have sinks [Hq] (float32 logits)."""

    attention: AttentionMixer
    sinks: np.ndarray

    @property
    def rope(self) -> RopeTable | None:
        return self.attention.rope

    def run(self, be: Backend, x: Any, ctx: PassContext) -> Any:
        return self.attention.run(_WithSinks(be, self.sinks), x, ctx)
