"""Multi-head latent attention (DeepSeek-V3's MLA), its cache of latents, and the decoder whose
states hold that cache.

Per token, a down projection gives the query's compressed rows (q_lora_rank, RMS-normed, then
up-projected to every head's nope and rope dimensions), the key/value latent c (kv_lora_rank,
RMS-normed) and one rope key k_r shared by every head. The cache holds [c; rope(k_r)] per token
and layer, nothing else: one buffer [1, capacity, kv_lora_rank + qk_rope_head_dim].

Head h's key is [W_uk_h c; k_r] and its value W_uv_h c (kv_b_proj holds W_uk_h then W_uv_h for
each head). The up-projections are absorbed: the query becomes [W_uk_h^T q_nope_h; rope(q_r_h)]
and attends over the cached [c; k_r] as a single key head, the cached rows serving as values
too; the first kv_lora_rank dimensions of the result, times W_uv_h, are the head's output. The
scores are those of the expanded keys (q_nope . W_uk c = W_uk^T q_nope . c), summed in another
order.

Invariant: every row, in a one-row step and in a multi-row pass alike, takes this one absorbed
path through the backend's row invariant linear, rms_norm, rope and attention (keys in fixed
absolute-position chunks); the host only copies (joins heads, slices). So a row has the bits of
a one-row step at its position, whatever the pass. Rope pairs stored interleaved (DeepSeek's
`rope_interleave`) are put in rotate-half order at load, for q and k alike, so scores are
unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend
from exactdraft.formats.table import stack_rows
from exactdraft.models.blocks import RopeTable
from exactdraft.models.cache import KVCache
from exactdraft.models.decoder import DecoderModel
from exactdraft.models.mixers import PassContext
from exactdraft.models.recurrent import F32
from exactdraft.models.state import SequenceState
from exactdraft.models.tensors import TensorReader


class LatentCache(KVCache):
    """A KVCache whose values are its keys: one buffer per layer [1, capacity, width] holding
    each position's latent and rope key (LatentAttention writes and reads it)."""

    def _reserve(self, length: int) -> None:
        if length <= self.capacity:
            return
        capacity = self._rounded(max(length, 2 * self.capacity))
        capacity = max(min(capacity, self._rounded(self.max_length)), self._rounded(length))
        old = self.keys or [None] * self.num_layers
        self.keys = [self.backend.kv_buffer(1, capacity, self.head_dim, buffer)
                     for buffer in old]
        self.values, self.capacity = self.keys, capacity

    def write(self, layer: int, start: int, keys: Any, values: Any = None) -> None:
        self.keys[layer] = self.backend.kv_write(self.keys[layer], start, keys)

    def move(self, sources: Any, destinations: Any) -> None:
        for layer in range(self.num_layers):
            self.keys[layer] = self.backend.kv_move(self.keys[layer], sources, destinations)


@dataclass
class LatentAttention:
    """`down` holds the rows of q_a_proj (absent without a q_lora_rank), then of
    kv_a_proj_with_mqa: latent then rope key; `q_up` is q_b_proj (or q_proj), each head's nope
    rows then rope rows."""

    down: Any
    q_up: Any
    key_absorb: list[Any]  # per head W_uk_h^T [kv_lora_rank, nope]
    value_up: list[Any]  # per head W_uv_h [v_head_dim, kv_lora_rank]
    output: Any  # o_proj [H, heads * v_head_dim]
    kv_norm: Any
    q_norm: Any  # None without a q_lora_rank
    num_heads: int
    q_rank: int  # 0 without a q_lora_rank
    latent_dim: int
    nope_dim: int
    rope_dim: int
    value_dim: int
    kv_slot: int
    eps: float
    scale: float
    rope: RopeTable
    down_bias: Any = None
    output_bias: Any = None

    def run(self, be: Backend, x: Any, ctx: PassContext) -> Any:
        count, heads = x.shape[0], self.num_heads
        rank, latent_dim, nope = self.q_rank, self.latent_dim, self.nope_dim
        width = latent_dim + self.rope_dim
        down = be.linear(x, self.down, self.down_bias)
        q_in = be.rms_norm(down[:, :rank], self.q_norm, self.eps) if rank else x
        q = be.linear(q_in, self.q_up).reshape(count, heads, nope + self.rope_dim)
        latent = be.rms_norm(down[:, rank:rank + latent_dim], self.kv_norm, self.eps)
        cos, sin = ctx.rope_rows(self.rope)
        q_rope = be.to_host(be.rope(q[:, :, nope:], cos, sin))
        k_rope = be.to_host(be.rope(down[:, rank + latent_dim:].reshape(count, 1, -1), cos,
                                    sin))
        query = np.empty((count, heads, width), F32)
        for head in range(heads):
            query[:, head, :latent_dim] = be.to_host(be.linear(q[:, head, :nope],
                                                               self.key_absorb[head]))
        query[:, :, latent_dim:] = q_rope
        entry = np.concatenate([be.to_host(latent), k_rope[:, 0]], axis=1)[:, None, :]
        query, entry = be.vector(query), be.vector(np.ascontiguousarray(entry))
        # A LatentCache's values are its keys: the entry is written once and read as both.
        attended = be.to_host(ctx.attend(be, query, self.kv_slot, 0, self.scale, entry, entry))
        heads_out = np.empty((count, heads * self.value_dim), F32)
        for head in range(heads):
            rows = be.vector(np.ascontiguousarray(attended[:, head, :latent_dim]))
            heads_out[:, head * self.value_dim:(head + 1) * self.value_dim] = \
                be.to_host(be.linear(rows, self.value_up[head]))
        return be.linear(be.vector(heads_out), self.output, self.output_bias)


def interleaved_to_half(dim: int) -> np.ndarray:
    """The order that puts interleaved rope pairs (2i, 2i + 1) at (i, i + dim / 2)."""
    return np.concatenate([np.arange(0, dim, 2), np.arange(1, dim, 2)])


def load_latent_attention(be: Backend, reader: TensorReader, prefix: str, *, hidden: int,
                          heads: int, q_rank: int, latent_dim: int, nope_dim: int,
                          rope_dim: int, value_dim: int, kv_slot: int, eps: float, scale: float,
                          rope: RopeTable, interleaved: bool, bias: bool) -> LatentAttention:
    """A LatentAttention from `prefix` + q_a_proj, q_a_layernorm, q_b_proj (or q_proj),
    kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj (or its two halves as llama.cpp splits
    them: k_b_proj, each head's W_uk^T [latent, nope] stacked, and v_b_proj), o_proj (+ the
    biases of q_a_proj, kv_a_proj_with_mqa and o_proj where `bias`)."""
    head_rows = nope_dim + rope_dim
    order = interleaved_to_half(rope_dim) if interleaved else np.arange(rope_dim)
    kv_down = reader.array(f"{prefix}kv_a_proj_with_mqa.weight", (latent_dim + rope_dim, hidden))
    kv_order = np.concatenate([np.arange(latent_dim), latent_dim + order])
    head_order = np.concatenate([np.arange(nope_dim), nope_dim + order])
    up_name = f"{prefix}q_b_proj.weight" if q_rank else f"{prefix}q_proj.weight"
    q_up = reader.array(up_name, (heads * head_rows, q_rank or hidden))
    q_up = q_up.reshape(heads, head_rows, -1)[:, head_order].reshape(heads * head_rows, -1)
    down_parts = [kv_down[kv_order]]
    biases = [reader.array(f"{prefix}kv_a_proj_with_mqa.bias",
                           (latent_dim + rope_dim,))[kv_order]] if bias else []
    if q_rank:
        down_parts.insert(0, reader.get(f"{prefix}q_a_proj.weight", (q_rank, hidden)))
        if bias:
            biases.insert(0, reader.array(f"{prefix}q_a_proj.bias", (q_rank,)))
    if reader.has(f"{prefix}kv_b_proj.weight"):
        up = reader.array(f"{prefix}kv_b_proj.weight", (heads * (nope_dim + value_dim),
                                                        latent_dim)).reshape(heads, -1, latent_dim)
        key_up, value_up = up[:, :nope_dim].transpose(0, 2, 1), up[:, nope_dim:]
    else:  # llama.cpp's split: k_b_proj [heads, latent, nope] (transposed), v_b_proj
        key_up = reader.array(f"{prefix}k_b_proj.weight", (heads * latent_dim, nope_dim))
        key_up = key_up.reshape(heads, latent_dim, nope_dim)
        value_up = reader.array(f"{prefix}v_b_proj.weight", (heads * value_dim, latent_dim))
        value_up = value_up.reshape(heads, value_dim, latent_dim)
    return LatentAttention(
        down=be.matrix(stack_rows(down_parts)), q_up=be.matrix(np.ascontiguousarray(q_up)),
        key_absorb=[be.matrix(np.ascontiguousarray(key_up[h])) for h in range(heads)],
        value_up=[be.matrix(np.ascontiguousarray(value_up[h])) for h in range(heads)],
        output=be.matrix(reader.get(f"{prefix}o_proj.weight", (hidden, heads * value_dim))),
        kv_norm=be.vector(reader.array(f"{prefix}kv_a_layernorm.weight", (latent_dim,))),
        q_norm=be.vector(reader.array(f"{prefix}q_a_layernorm.weight", (q_rank,)))
        if q_rank else None,
        num_heads=heads, q_rank=q_rank, latent_dim=latent_dim, nope_dim=nope_dim,
        rope_dim=rope_dim, value_dim=value_dim, kv_slot=kv_slot, eps=eps, scale=scale,
        rope=rope, down_bias=be.vector(np.concatenate(biases)) if bias else None,
        output_bias=be.vector(reader.array(f"{prefix}o_proj.bias", (hidden,)))
        if bias else None)


class LatentDecoderModel(DecoderModel):
    """A DecoderModel whose states hold a LatentCache (the trunk's num_kv_heads is 1 and its
    head_dim the latent plus rope width)."""

    def new_state(self) -> SequenceState:
        t = self.trunk
        cache = LatentCache(self.backend, t.kv_layers, 1, t.head_dim, self.max_context)
        state = SequenceState(cache, [m.empty_state() for m in self.recurrent],
                              self.rollback_window, log_tokens=not self.kv_prefixes)
        self._states.add(state)
        return state
