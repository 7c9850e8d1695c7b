"""The pieces every decoder family shares, written once against the Backend protocol.

Invariant: these functions never branch on the backend, so they are exactly as row invariant as
the backend's ops: a row's result depends on that row (and, for attention, the cache up to its
own position) only. `decoder_layer` is the per-op reference body of a DecoderLayer; a backend's
fused layer must give its bits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from exactdraft import float64_math
from exactdraft.backends.base import Backend, DecoderLayer, LayerShape
from exactdraft.errors import WeightError
from exactdraft.models.cache import KVCache
from exactdraft.models.config import RopeScaling


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """Inverse frequencies [head_dim / 2] in float64, with llama3/linear scaling applied;
    computed with exactdraft's own float64 power, so the same on every machine."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    inv_freq = 1.0 / float64_math.power(theta, exponents)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    old_context = scaling.original_max_position_embeddings
    low_wavelen = old_context / scaling.low_freq_factor
    high_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


class RopeTable:
    """cos and sin [positions, head_dim / 2] of one set of frequencies, from exactdraft's own
    float64 sin and cos (numpy's differ between machines in the last bit). Rows are computed
    as positions are first used: row p depends on p alone, so growing the table never changes
    a row."""

    def __init__(self, inv_freq: np.ndarray) -> None:
        self.inv_freq = np.asarray(inv_freq, dtype=np.float64)
        empty = np.zeros((0, self.inv_freq.size), np.float32)
        self.cos, self.sin = empty, empty  # float32 [built, head_dim / 2] on the host

    def _grow(self, length: int) -> None:
        built = self.cos.shape[0]
        if length <= built:
            return
        length = max(length, 2 * built, 256)
        angles = np.arange(built, length, dtype=np.float64)[:, None] * self.inv_freq
        sine, cosine = float64_math.sincos(angles)
        self.cos = np.concatenate([self.cos, cosine.astype(np.float32)])
        self.sin = np.concatenate([self.sin, sine.astype(np.float32)])

    def rows(self, backend: Backend, positions: np.ndarray) -> tuple[Any, Any]:
        """cos and sin rows [len(positions), head_dim / 2] on the backend."""
        self._grow(int(positions.max()) + 1)
        return backend.vector(self.cos[positions]), backend.vector(self.sin[positions])


def check_shapes(expected: Mapping[str, tuple[int, ...]], shape_of: Any, source: str) -> None:
    """A WeightError naming the first tensor that is missing or has another shape."""
    for name, shape in expected.items():
        try:
            found = tuple(shape_of(name))
        except KeyError:
            raise WeightError(f"{source}: checkpoint is missing tensor {name!r}") from None
        if found != shape:
            raise WeightError(f"{source}: tensor {name!r} has shape {found}, expected {shape} "
                              "from the config")


class SequencePart(NamedTuple):
    """One sequence's rows in a pass: `rows` rows into slots start .. of its cache; a chain at
    the positions of its slots, or a token tree (exactdraft.models.token_tree) whose row r sits
    at start + depths[r] and sees its path's keys."""

    cache: KVCache
    start: int
    rows: int
    depths: np.ndarray | None = None  # [rows] int32
    tree_paths: np.ndarray | None = None  # [rows, rows] int32

    def positions(self) -> np.ndarray:
        if self.depths is None:
            return np.arange(self.start, self.start + self.rows, dtype=np.int64)
        return self.start + self.depths.astype(np.int64)


def decoder_layer(be: Backend, layer: DecoderLayer, shape: LayerShape, hidden: Any,
                  sequences: Sequence[SequencePart], index: int, cos: Any, sin: Any) -> Any:
    """One decoder layer (DecoderLayer's docstring) for hidden rows [M, H]: the rows of the
    sequences in order, each attending to its own cache at layer `index`. Every op but
    attention is row by row, so a row has the bits it gets with its sequence alone."""
    count = hidden.shape[0]
    heads, kv_heads, dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
    q_size, kv_size = heads * dim, kv_heads * dim
    x = be.rms_norm(hidden, layer.attention_norm, shape.eps)
    qkv = be.linear(x, layer.qkv, layer.qkv_bias)
    q = qkv[:, :q_size].reshape(count, heads, dim)
    k = qkv[:, q_size:q_size + kv_size].reshape(count, kv_heads, dim)
    v = qkv[:, q_size + kv_size:].reshape(count, kv_heads, dim)
    if layer.q_norm is not None:
        q = be.rms_norm(q, layer.q_norm, shape.eps)
        k = be.rms_norm(k, layer.k_norm, shape.eps)
    q = be.rope(q, cos, sin)
    k = be.rope(k, cos, sin)
    parts, first = [], 0
    for part in sequences:
        end = first + part.rows
        part.cache.write(index, part.start, k[first:end], v[first:end])
        tree = {} if part.tree_paths is None else {"tree_paths": part.tree_paths}
        parts.append(be.attention(q[first:end], part.cache.keys[index],
                                  part.cache.values[index], part.positions(), shape.window,
                                  shape.attention_scale, **tree))
        first = end
    attended = parts[0] if len(parts) == 1 else be.concatenate(parts)
    out = be.linear(attended.reshape(count, q_size), layer.output, layer.output_bias)
    if layer.post_attention_norm is not None:
        out = be.rms_norm(out, layer.post_attention_norm, shape.eps)
    hidden = hidden + out
    x = be.rms_norm(hidden, layer.mlp_norm, shape.eps)
    gate_up = be.linear(x, layer.gate_up, layer.gate_up_bias)
    gated = be.silu_mul(gate_up) if shape.activation == "silu" else be.gelu_mul(gate_up)
    out = be.linear(gated, layer.down, layer.down_bias)
    if layer.post_mlp_norm is not None:
        out = be.rms_norm(out, layer.post_mlp_norm, shape.eps)
    return hidden + out
