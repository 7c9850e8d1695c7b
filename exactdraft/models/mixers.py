"""The attention token mixer and the dense feed-forward of every decoder family, and what a
layer sees of a pass.

Invariant: a mixer's output for a row has the bits it gets when its sequence runs alone and the
row is computed by itself. Matmuls, norms, rope and attention go through the backend's row
invariant ops; the host does only elementwise float32 arithmetic and float64_math's
transcendentals (the sigmoid of an output gate, squared ReLU), which depend on the row alone.

Attention covers the families' variants: grouped-query heads, per-head q/k RMS norms, rope on
the first `rotary_dim` dimensions of each head (q and k rows are permuted at load so that the
rotated pairs are (i, i + D/2) and the unrotated dimensions meet cos 1, sin 0, which leaves
them exactly as they are; scores are unchanged since q and k are permuted alike), no rope at
all, sliding windows, biases, and an output gate (Qwen3-Next: the attended rows times sigmoid
of a second half of q_proj, before o_proj); and token trees, where a row sits at its depth past
the sequence's start and attends to its own path only (tree_attention backends). The dense
feed-forward is silu- or GELU-tanh-gated, or squared ReLU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend
from exactdraft.formats.table import stack_rows
from exactdraft.models.blocks import RopeTable
from exactdraft.models.recurrent import F32, sigmoid32
from exactdraft.models.state import SequenceState
from exactdraft.models.tensors import TensorReader


@dataclass
class SequencePass:
    """One sequence's rows in a pass: `count` rows into KV slots start.. of its state; a chain
    at the positions of its slots, or a token tree (exactdraft.models.token_tree) whose row r
    sits at start + depths[r] and sees its path's keys. Recurrent mixers put in
    `row_states[slot]` their state after each row r >= keep_from."""

    state: SequenceState
    start: int
    count: int
    keep_from: int
    depths: np.ndarray | None = None  # [count] int32
    tree_paths: np.ndarray | None = None  # [count, count] int32
    row_states: dict[int, list[Any]] = field(default_factory=dict)

    def positions(self) -> np.ndarray:
        if self.depths is None:
            return np.arange(self.start, self.start + self.count, dtype=np.int64)
        return self.start + self.depths.astype(np.int64)


class PassContext:
    """The sequences of one pass, in row order, and their rope rows (computed once a pass)."""

    def __init__(self, backend: Backend, parts: list[SequencePass]) -> None:
        self.backend = backend
        self.parts = parts
        self.positions = np.concatenate([p.positions() for p in parts])
        self._rope: dict[int, tuple[Any, Any]] = {}

    def rope_rows(self, table: RopeTable) -> tuple[Any, Any]:
        if id(table) not in self._rope:
            self._rope[id(table)] = table.rows(self.backend, self.positions)
        return self._rope[id(table)]

    def attend(self, be: Backend, q: Any, kv_slot: int, window: int, scale: float,
               keys: Any = None, values: Any = None) -> Any:
        """Each sequence's rows of q [rows, heads, dim] attended over its cache's KV slot by
        `be` (the mixer's backend, which may wrap the pass's), in row order; `keys` and
        `values` (the pass's rows), where given, are written into the slot first (None: the
        slot an earlier layer wrote is read)."""
        attended, row = [], 0
        for part in self.parts:
            end = row + part.count
            cache = part.state.cache
            if keys is not None:
                cache.write(kv_slot, part.start, keys[row:end], values[row:end])
            tree = {} if part.tree_paths is None else {"tree_paths": part.tree_paths}
            attended.append(be.attention(q[row:end], cache.keys[kv_slot],
                                         cache.values[kv_slot], part.positions(), window,
                                         scale, **tree))
            row = end
        return attended[0] if len(attended) == 1 else be.concatenate(attended)

    def each_sequence(self, rows: np.ndarray, run: Any) -> np.ndarray:
        """run(part, the part's rows) for each sequence, its results concatenated in row
        order (a recurrent mixer's host-side scan)."""
        outputs, first = [], 0
        for part in self.parts:
            outputs.append(run(part, rows[first:first + part.count]))
            first += part.count
        return outputs[0] if len(outputs) == 1 else np.concatenate(outputs)


def rotary_permutation(head_dim: int, rotary_dim: int) -> np.ndarray:
    """Within a head, the order that puts rotary pair (i, i + R/2) at (i, i + D/2): new
    dimension j holds old dimension order[j]."""
    rot_half, rest = rotary_dim // 2, (head_dim - rotary_dim) // 2
    return np.concatenate([np.arange(rot_half), rotary_dim + np.arange(rest),
                           rot_half + np.arange(rot_half), rotary_dim + rest + np.arange(rest)])


def rotary_frequencies(head_dim: int, rotary_dim: int, inv_freq: np.ndarray) -> np.ndarray:
    """The D/2 frequencies of a partial rope after rotary_permutation: the rotated pairs' own,
    then zeros (angle 0: cos 1, sin 0)."""
    return np.concatenate([inv_freq, np.zeros(head_dim // 2 - rotary_dim // 2)])


@dataclass
class AttentionMixer:
    qkv: Any  # rows: q heads, then the output gate's heads if gated, then k, then v
    output: Any
    num_heads: int
    num_kv_heads: int
    head_dim: int
    kv_slot: int
    eps: float
    scale: float
    qkv_bias: Any = None
    output_bias: Any = None
    q_norm: Any = None
    k_norm: Any = None
    rope: RopeTable | None = None
    window: int = 0
    gated: bool = False

    def run(self, be: Backend, x: Any, ctx: PassContext) -> Any:
        count = x.shape[0]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        q_size, kv_size = heads * dim, kv_heads * dim
        proj = be.linear(x, self.qkv, self.qkv_bias)
        q = proj[:, :q_size].reshape(count, heads, dim)
        first = 2 * q_size if self.gated else q_size
        k = proj[:, first:first + kv_size].reshape(count, kv_heads, dim)
        v = proj[:, first + kv_size:].reshape(count, kv_heads, dim)
        if self.q_norm is not None:
            q = be.rms_norm(q, self.q_norm, self.eps)
            k = be.rms_norm(k, self.k_norm, self.eps)
        if self.rope is not None:
            cos, sin = ctx.rope_rows(self.rope)
            q, k = be.rope(q, cos, sin), be.rope(k, cos, sin)
        attended = ctx.attend(be, q, self.kv_slot, self.window, self.scale, k, v)
        attended = attended.reshape(count, q_size)
        if self.gated:
            gate = be.to_host(proj[:, q_size:2 * q_size])
            attended = be.vector(be.to_host(attended) * sigmoid32(gate))
        return be.linear(attended, self.output, self.output_bias)


@dataclass
class DenseMLP:
    """silu- or GELU-tanh-gated (gate_up holds gate then up; activation "silu" or
    "gelu_tanh") or, with activation "relu2", up then relu(x)**2 (Nemotron-H). `inner_size`,
    where known, lets a backend fuse the layer (exactdraft.models.layer.fused_layer)."""

    gate_up: Any
    down: Any
    activation: str = "silu"
    gate_up_bias: Any = None
    down_bias: Any = None
    inner_size: int = 0

    def run(self, be: Backend, x: Any, ctx: PassContext | None = None) -> Any:
        return self.finish(be, be.linear(x, self.gate_up, self.gate_up_bias))

    def finish(self, be: Backend, inner: Any) -> Any:
        """The MLP from its inner rows (x gate_up^T (+ bias), contiguous) on."""
        if self.activation == "silu":
            inner = be.silu_mul(inner)
        elif self.activation == "gelu_tanh":
            inner = be.gelu_mul(inner)
        else:
            positive = np.maximum(be.to_host(inner), F32(0.0))
            inner = be.vector(positive * positive)
        return be.linear(inner, self.down, self.down_bias)


def dense_weights(reader: TensorReader, prefix: str, hidden: int, inner: int,
                  names: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")
                  ) -> tuple[Any, Any]:
    """(inner rows, down) of an MLP stored as `prefix` + names[i] + ".weight": gate, up and
    down, or up and down (not gated)."""
    *into, out = names
    weights = [reader.get(f"{prefix}{name}.weight", (inner, hidden)) for name in into]
    return (stack_rows(weights) if len(weights) > 1 else weights[0],
            reader.get(f"{prefix}{out}.weight", (hidden, inner)))


def dense_mlp(be: Backend, reader: TensorReader, prefix: str, hidden: int, inner: int,
              names: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj"),
              activation: str = "silu") -> DenseMLP:
    """A DenseMLP from `prefix` + names[i] + ".weight": gate, up, down (silu) or up, down
    (relu2)."""
    into, down = dense_weights(reader, prefix, hidden, inner, names)
    return DenseMLP(be.matrix(into), be.matrix(down), activation, inner_size=inner)


def permuted_rows(weight: Any, heads: int, order: np.ndarray) -> np.ndarray:
    """A projection's rows [heads * D, K] with each head's rows in `order`."""
    dense = np.asarray(weight, dtype=F32)
    dim = order.size
    return np.ascontiguousarray(dense.reshape(heads, dim, -1)[:, order].reshape(heads * dim, -1))


def norm_vector(be: Backend, reader: TensorReader, name: str, size: int,
                shift: float = 0.0) -> Any:
    """An RMS norm weight as the backend's vector, plus `shift` (1.0 for the families that
    store w and scale by float32(1 + w))."""
    weight = reader.array(name, (size,))
    return be.vector(weight + F32(shift) if shift else weight)


def load_attention(be: Backend, reader: TensorReader, prefix: str, *, hidden: int, heads: int,
                   kv_heads: int, head_dim: int, kv_slot: int, eps: float,
                   rope: RopeTable | None, rotary_dim: int | None = None,
                   qk_norm: bool = False, norm_shift: float = 0.0, gated: bool = False,
                   bias: bool = False, window: int = 0,
                   output_bias: bool | None = None) -> AttentionMixer:
    """An AttentionMixer from `prefix` + q_proj, k_proj, v_proj, o_proj (+ q_norm, k_norm).
    A gated q_proj holds, per head, D query rows then D gate rows (Qwen3-Next's layout);
    with rotary_dim < head_dim the q and k rows (and their norms) are put in
    rotary_permutation's order. `output_bias` (default: `bias`) says whether o_proj has one
    (GLM-4.5's q, k and v have biases, its o_proj none)."""
    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    q = reader.get(f"{prefix}q_proj.weight", ((2 if gated else 1) * q_rows, hidden))
    k = reader.get(f"{prefix}k_proj.weight", (kv_rows, hidden))
    v = reader.get(f"{prefix}v_proj.weight", (kv_rows, hidden))
    biases = None
    if bias:
        biases = [reader.array(f"{prefix}{n}_proj.bias", (rows,)) for n, rows in
                  (("q", q.shape[0]), ("k", kv_rows), ("v", kv_rows))]
    gate = None
    if gated:
        pairs = np.asarray(q, dtype=F32).reshape(heads, 2, head_dim, hidden)
        q, gate = pairs[:, 0].reshape(q_rows, hidden), pairs[:, 1].reshape(q_rows, hidden)
        if biases is not None:
            paired = biases[0].reshape(heads, 2, head_dim)
            biases[0:1] = [paired[:, 0].reshape(-1), paired[:, 1].reshape(-1)]
    order = None
    if rotary_dim is not None and rotary_dim < head_dim:
        order = rotary_permutation(head_dim, rotary_dim)
        q, k = permuted_rows(q, heads, order), permuted_rows(k, kv_heads, order)
        if biases is not None:
            biases[0] = biases[0].reshape(heads, head_dim)[:, order].reshape(-1)
            biases[-2] = biases[-2].reshape(kv_heads, head_dim)[:, order].reshape(-1)
    norms = [None, None]
    if qk_norm:
        for i, name in enumerate(("q_norm", "k_norm")):
            weight = reader.array(f"{prefix}{name}.weight", (head_dim,)) + F32(norm_shift)
            norms[i] = be.vector(weight if order is None else weight[order])
    with_output_bias = bias if output_bias is None else output_bias
    output_bias = be.vector(reader.array(f"{prefix}o_proj.bias", (hidden,))) \
        if with_output_bias else None
    return AttentionMixer(
        qkv=be.matrix(stack_rows([q, *([gate] if gated else []), k, v])),
        output=be.matrix(reader.get(f"{prefix}o_proj.weight", (hidden, q_rows))),
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, kv_slot=kv_slot, eps=eps,
        scale=head_dim ** -0.5,
        qkv_bias=None if biases is None else be.vector(np.concatenate(biases)),
        output_bias=output_bias, q_norm=norms[0], k_norm=norms[1], rope=rope, window=window,
        gated=gated)
