"""Gemma 4's decoder layer and model: attention with a value norm whose later layers may read
an earlier layer's keys and values, per-layer input embeddings, a dense MLP beside an optional
mixture of experts, a per-layer output scalar, and soft-capped logits.

Invariant: every row keeps the bits it has alone (mixers.py, moe.py): matmuls, norms, rope,
attention and the gated GELU go through the backend's row invariant ops; the host does only
elementwise float32 arithmetic and float64_math's transcendentals, which depend on the row
alone. A layer that reads another layer's keys and values reads that layer's KV slot, written
earlier in the same pass for the rows of the pass, so chunked, drafted and serial passes see
the same keys. The per-layer inputs of a pass are computed once from its token ids and
embedding rows, row by row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft import float64_math
from exactdraft.backends.base import Backend
from exactdraft.models.blocks import RopeTable
from exactdraft.models.decoder import DecoderModel
from exactdraft.models.layered_cache import LayeredKVCache
from exactdraft.models.mixers import DenseMLP, PassContext
from exactdraft.models.moe import RouterSettings, route
from exactdraft.models.recurrent import F32
from exactdraft.models.rows import embedding_rows
from exactdraft.models.state import SequenceState


@dataclass
class SharedKVAttention:
    """q = rope(rms_norm(x Wq, q_norm)); where the layer writes its KV slot, k = rope(
    rms_norm(x Wk, k_norm)) and v = rms_norm(x Wv) (no weight; Wv is Wk where
    `values_are_keys`), else the slot an earlier layer wrote is read; scores are q.k times
    `scale`. qkv holds q's rows, then k's and v's (v's only where they are not k's; none for
    a reading layer)."""

    qkv: Any
    output: Any
    num_heads: int
    num_kv_heads: int
    head_dim: int
    kv_slot: int
    eps: float
    q_norm: Any
    rope: RopeTable
    writes: bool = True
    k_norm: Any = None
    unit_norm: Any = None  # ones [head_dim]: the value norm's weight
    window: int = 0
    scale: float = 1.0
    values_are_keys: bool = False

    def run(self, be: Backend, x: Any, ctx: PassContext) -> Any:
        count = x.shape[0]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        q_size, kv_size = heads * dim, kv_heads * dim
        proj = be.linear(x, self.qkv)
        cos, sin = ctx.rope_rows(self.rope)
        q = be.rope(be.rms_norm(proj[:, :q_size].reshape(count, heads, dim), self.q_norm,
                                self.eps), cos, sin)
        if self.writes:
            k = proj[:, q_size:q_size + kv_size].reshape(count, kv_heads, dim)
            v_start = q_size if self.values_are_keys else q_size + kv_size
            v = proj[:, v_start:v_start + kv_size].reshape(count, kv_heads, dim)
            k = be.rope(be.rms_norm(k, self.k_norm, self.eps), cos, sin)
            v = be.rms_norm(v, self.unit_norm, self.eps)
        else:
            k = v = None  # the slot an earlier layer wrote
        attended = ctx.attend(be, q, self.kv_slot, self.window, self.scale, k, v)
        return be.linear(attended.reshape(count, q_size), self.output)


class PerLayerInputs:
    """The per-layer input rows of a pass, [rows, layers, size]: (rms_norm(e W / sqrt(H),
    norm) + table[id] * sqrt(size)) / sqrt(2) for embedding rows e (scaled) and token ids,
    computed at the first layer's request and shared by every layer."""

    def __init__(self, table: Any, projection: Any, norm: Any, layers: int, size: int,
                 hidden_size: int, eps: float) -> None:
        self.table, self.projection, self.norm = table, projection, norm
        self.layers, self.size, self.eps = layers, size, eps
        self.table_scale = F32(np.sqrt(np.float64(size)))
        self.projection_scale = F32(hidden_size ** -0.5)
        self.token_ids: np.ndarray | None = None
        self.rows: np.ndarray | None = None

    def start(self, ids: np.ndarray | None) -> None:
        """A new pass over these token ids (in row order); None after a pass, so that its
        rows are not held."""
        self.token_ids, self.rows = ids, None

    def layer_rows(self, be: Backend, layer: int, embedded: Any) -> np.ndarray:
        """Layer `layer`'s rows [rows, size] on the host; `embedded` (the first layer's input,
        the scaled embedding rows) is read at the pass's first request."""
        if self.rows is None:
            count = self.token_ids.size
            projected = be.to_host(be.linear(embedded, self.projection)) * self.projection_scale
            normed = be.to_host(be.rms_norm(
                be.vector(projected.reshape(count, self.layers, self.size)), self.norm, self.eps))
            token_rows = embedding_rows(self.table, self.token_ids) * self.table_scale
            self.rows = (normed + token_rows.reshape(normed.shape)) * F32(2.0 ** -0.5)
        return self.rows[:, layer]


@dataclass
class ScaledExperts:
    """Gemma 4's mixture of experts beside the dense MLP: the router reads rms_norm(h, router
    norm) (the norm's weight times 1 / sqrt(H) folded in), softmax top-k renormalised, each
    chosen weight times its expert's scale; the experts read rms_norm(h, input_norm); the sum
    leaves through rms_norm(., output_norm)."""

    router: Any  # [E, H]
    router_norm: Any
    input_norm: Any
    output_norm: Any
    settings: RouterSettings
    expert_scales: np.ndarray  # float32 [E]
    experts: list[DenseMLP]

    def run(self, be: Backend, hidden: Any, eps: float) -> Any:
        logits = be.to_host(be.linear(be.rms_norm(hidden, self.router_norm, eps), self.router))
        chosen, weights = route(self.settings, logits)
        weights = weights * self.expert_scales[chosen]
        rows_in = be.to_host(be.rms_norm(hidden, self.input_norm, eps))
        total = np.zeros(rows_in.shape, dtype=F32)
        for expert in np.unique(chosen):
            rows, slots = np.nonzero(chosen == expert)
            out = be.to_host(self.experts[int(expert)].run(be, be.vector(rows_in[rows])))
            total[rows] = total[rows] + out * weights[rows, slots][:, None]
        return be.rms_norm(be.vector(total), self.output_norm, eps)


@dataclass
class PerLayerGate:
    """h + rms_norm(gelu_tanh(h Wg) * per-layer input, W_proj, norm)."""

    gate: Any  # [size, H]
    projection: Any  # [H, size]
    norm: Any

    def run(self, be: Backend, hidden: Any, inputs: np.ndarray, eps: float) -> Any:
        gate = be.to_host(be.linear(hidden, self.gate))
        inner = be.gelu_mul(be.vector(np.concatenate([gate, inputs], axis=1)))
        return hidden + be.rms_norm(be.linear(inner, self.projection), self.norm, eps)


@dataclass
class Gemma4Layer:
    """h += post_attention_norm(attention(rms_norm(h))); then h += post_mlp_norm(m) with
    m = mlp(rms_norm(h)), or with experts post_mlp_norm_1(m) + experts(h); then the per-layer
    gate; then h times the layer's scalar."""

    attention_norm: Any
    mixer: SharedKVAttention
    post_attention_norm: Any
    mlp_norm: Any
    feed_forward: DenseMLP
    post_mlp_norm: Any
    index: int
    dense_output_norm: Any = None  # post_feedforward_layernorm_1, with experts
    experts: ScaledExperts | None = None
    per_layer_gate: PerLayerGate | None = None
    per_layer_inputs: PerLayerInputs | None = None
    scalar: Any = None  # backend vector [1], where it is not 1

    def run(self, be: Backend, hidden: Any, ctx: PassContext, eps: float) -> Any:
        embedded = hidden
        out = self.mixer.run(be, be.rms_norm(hidden, self.attention_norm, eps), ctx)
        hidden = hidden + be.rms_norm(out, self.post_attention_norm, eps)
        out = self.feed_forward.run(be, be.rms_norm(hidden, self.mlp_norm, eps), ctx)
        if self.experts is not None:
            out = be.rms_norm(out, self.dense_output_norm, eps) + \
                self.experts.run(be, hidden, eps)
        hidden = hidden + be.rms_norm(out, self.post_mlp_norm, eps)
        if self.per_layer_gate is not None:
            inputs = self.per_layer_inputs.layer_rows(be, self.index, embedded)
            hidden = self.per_layer_gate.run(be, hidden, inputs, eps)
        return hidden if self.scalar is None else hidden * self.scalar


def soft_capped(logits: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(logits / cap), in float64 with float64_math (tanh(y) = 2 sigmoid(2y) - 1),
    rounded to float32 once."""
    y = np.asarray(logits, dtype=np.float64) / cap
    return (cap * (2.0 * float64_math.sigmoid(2.0 * y) - 1.0)).astype(np.float32)


class Gemma4Model(DecoderModel):
    """A DecoderModel whose KV slots differ in shape, whose passes start the per-layer inputs
    from their token ids, and whose logits are soft-capped where the config says."""

    def __init__(self, trunk: Any, backend: Backend, max_context: int | None,
                 slot_shapes: list[tuple[int, int]], per_layer_inputs: PerLayerInputs | None,
                 softcap: float | None) -> None:
        super().__init__(trunk, backend, max_context)
        self.slot_shapes = slot_shapes
        self.per_layer_inputs = per_layer_inputs
        self.softcap = softcap

    def new_state(self) -> SequenceState:
        state = super().new_state()
        state.cache = LayeredKVCache(self.backend, self.slot_shapes, self.max_context)
        return state

    def _pass(self, parts: list, ids: list[np.ndarray], rows: Any, features: bool) -> Any:
        inputs = self.per_layer_inputs
        if inputs is not None:
            inputs.start(np.concatenate(ids))
        try:
            out = super()._pass(parts, ids, rows, features)
        finally:
            if inputs is not None:
                inputs.start(None)
        if self.softcap is None:
            return out
        logits = out[0] if features else out
        capped = [soft_capped(part, self.softcap) for part in logits]
        return (capped, out[1]) if features else capped
