"""The decoder-only transformer Target for the llama family (llama, mistral, qwen2, qwen3).

Invariant: the model is written once against the Backend protocol and never branches on the
backend, so it is exactly as row invariant as the backend's ops: a W-row forward gives each
row the bits of a one-row forward at that position, and a prompt fed in one pass or in chunks
of any size leaves the same cache and the same last-row logits. Weights are checked by name and
shape before anything is built, so a bad checkpoint fails with the tensor named.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend
from exactdraft.models.cache import KVCache
from exactdraft.models.config import ModelConfig
from exactdraft.models.target import Rows
from exactdraft.models.weights import WeightError, stack_rows, weight_shape


@dataclass
class Layer:
    attention_norm: Any
    qkv: Any
    qkv_bias: Any | None
    output: Any
    output_bias: Any | None
    q_norm: Any | None
    k_norm: Any | None
    mlp_norm: Any
    gate_up: Any
    gate_up_bias: Any | None
    down: Any
    down_bias: Any | None
    window: int


def rope_frequencies(config: ModelConfig) -> np.ndarray:
    """Inverse frequencies [head_dim / 2] in float64, with llama3/linear scaling applied."""
    dim = config.head_dim
    inv_freq = 1.0 / config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    scaling = config.rope_scaling
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


class TransformerState:
    """One sequence's KV cache; `length` is the number of positions already in it."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache

    @property
    def length(self) -> int:
        return self.cache.length


class Transformer:
    """A llama-family decoder on any Backend; implements the Target protocol."""

    def __init__(self, config: ModelConfig, tensors: Mapping[str, Any], backend: Backend,
                 max_context: int | None = None) -> None:
        self.config = config
        self.backend = backend
        self.vocab_size = config.vocab_size
        self.max_context = min(max_context or config.max_position_embeddings,
                               config.max_position_embeddings)
        if self.max_context < 1:
            raise ValueError(f"max_context must be at least 1, got {max_context}")
        self._check_tensors(tensors)
        c = config
        self.embed = backend.vector(tensors["model.embed_tokens.weight"])
        head_name = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
        self.lm_head = backend.matrix(tensors[head_name])
        self.final_norm = backend.vector(tensors["model.norm.weight"])
        angles = np.arange(self.max_context, dtype=np.float64)[:, None] * rope_frequencies(c)
        self.rope_cos = backend.vector(np.cos(angles).astype(np.float32))
        self.rope_sin = backend.vector(np.sin(angles).astype(np.float32))
        self.layers = [self._layer(tensors, i) for i in range(c.num_layers)]
        self.scale = 1.0 / math.sqrt(c.head_dim)

    # -- loading ---------------------------------------------------------------------------

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.config
        q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        shapes = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
                  "model.norm.weight": (c.hidden_size,)}
        if not c.tie_word_embeddings:
            shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (c.hidden_size,)
            shapes[p + "post_attention_layernorm.weight"] = (c.hidden_size,)
            for name, out in (("q", q_out), ("k", kv_out), ("v", kv_out)):
                shapes[p + f"self_attn.{name}_proj.weight"] = (out, c.hidden_size)
                if c.attention_bias:
                    shapes[p + f"self_attn.{name}_proj.bias"] = (out,)
            shapes[p + "self_attn.o_proj.weight"] = (c.hidden_size, q_out)
            if c.attention_output_bias:
                shapes[p + "self_attn.o_proj.bias"] = (c.hidden_size,)
            if c.qk_norm:
                shapes[p + "self_attn.q_norm.weight"] = (c.head_dim,)
                shapes[p + "self_attn.k_norm.weight"] = (c.head_dim,)
            for name, shape in (("gate", (c.intermediate_size, c.hidden_size)),
                                ("up", (c.intermediate_size, c.hidden_size)),
                                ("down", (c.hidden_size, c.intermediate_size))):
                shapes[p + f"mlp.{name}_proj.weight"] = shape
                if c.mlp_bias:
                    shapes[p + f"mlp.{name}_proj.bias"] = shape[:1]
        return shapes

    def _check_tensors(self, tensors: Mapping[str, Any]) -> None:
        for name, expected in self._expected_shapes().items():
            if name not in tensors:
                raise WeightError(f"checkpoint is missing tensor {name!r}")
            found = weight_shape(tensors, name)
            if found != expected:
                raise WeightError(
                    f"tensor {name!r} has shape {found}, expected {expected} from the config"
                )

    def _layer(self, tensors: Mapping[str, Any], index: int) -> Layer:
        be, c, p = self.backend, self.config, f"model.layers.{index}."

        def optional(name: str) -> Any | None:
            return be.vector(tensors[p + name]) if p + name in tensors else None

        def stacked_bias(names: list[str]) -> Any | None:
            if not all(p + n in tensors for n in names):
                return None
            return be.vector(np.concatenate([np.asarray(tensors[p + n]) for n in names]))

        qkv = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
        gate_up = ["mlp.gate_proj", "mlp.up_proj"]
        return Layer(
            attention_norm=be.vector(tensors[p + "input_layernorm.weight"]),
            qkv=be.matrix(stack_rows([tensors[p + n + ".weight"] for n in qkv])),
            qkv_bias=stacked_bias([n + ".bias" for n in qkv]),
            output=be.matrix(tensors[p + "self_attn.o_proj.weight"]),
            output_bias=optional("self_attn.o_proj.bias"),
            q_norm=optional("self_attn.q_norm.weight"),
            k_norm=optional("self_attn.k_norm.weight"),
            mlp_norm=be.vector(tensors[p + "post_attention_layernorm.weight"]),
            gate_up=be.matrix(stack_rows([tensors[p + n + ".weight"] for n in gate_up])),
            gate_up_bias=stacked_bias([n + ".bias" for n in gate_up]),
            down=be.matrix(tensors[p + "mlp.down_proj.weight"]),
            down_bias=optional("mlp.down_proj.bias"),
            window=c.sliding_windows[index],
        )

    # -- Target protocol -------------------------------------------------------------------

    def new_state(self) -> TransformerState:
        c = self.config
        return TransformerState(KVCache(self.backend, c.num_layers, c.num_kv_heads, c.head_dim,
                                        self.max_context))

    def truncate(self, state: TransformerState, length: int) -> None:
        state.cache.truncate(length)

    def check_tokens(self, tokens: Sequence[int], start: int) -> np.ndarray:
        """Token ids as int64, or a ValueError naming the first bad id or the context overrun."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError("forward needs at least one token")
        bad = np.flatnonzero((ids < 0) | (ids >= self.vocab_size))
        if bad.size:
            raise ValueError(
                f"token id {int(ids[bad[0]])} at index {int(bad[0])} is outside the "
                f"vocabulary [0, {self.vocab_size})"
            )
        if start + ids.size > self.max_context:
            raise ValueError(
                f"{start + ids.size} positions exceed the model's context of {self.max_context}"
            )
        return ids

    def forward(self, state: TransformerState, tokens: Sequence[int],
                rows: Rows = "last") -> np.ndarray:
        if rows not in ("last", "all"):
            raise ValueError(f"rows must be 'last' or 'all', got {rows!r}")
        be, c, cache = self.backend, self.config, state.cache
        start = cache.length
        ids = self.check_tokens(tokens, start)
        count = ids.size
        positions = np.arange(start, start + count, dtype=np.int64)
        cache.reserve_for(count)
        cos = be.embedding(self.rope_cos, positions)
        sin = be.embedding(self.rope_sin, positions)
        q_size = c.num_heads * c.head_dim
        kv_size = c.num_kv_heads * c.head_dim
        hidden = be.embedding(self.embed, ids)
        # A backend may run a whole layer in one call; it must give the bits of the body below.
        fused = getattr(be, "decoder_layer", None)
        for index, layer in enumerate(self.layers):
            if fused is not None:
                hidden = fused(hidden, layer, cache.keys[index], cache.values[index], start, cos,
                               sin, self.scale, c)
                continue
            x = be.rms_norm(hidden, layer.attention_norm, c.rms_norm_eps)
            qkv = be.linear(x, layer.qkv, layer.qkv_bias)
            q = qkv[:, :q_size].reshape(count, c.num_heads, c.head_dim)
            k = qkv[:, q_size:q_size + kv_size].reshape(count, c.num_kv_heads, c.head_dim)
            v = qkv[:, q_size + kv_size:].reshape(count, c.num_kv_heads, c.head_dim)
            if layer.q_norm is not None:
                q = be.rms_norm(q, layer.q_norm, c.rms_norm_eps)
                k = be.rms_norm(k, layer.k_norm, c.rms_norm_eps)
            q = be.rope(q, cos, sin)
            k = be.rope(k, cos, sin)
            cache.write(index, start, k, v)
            attended = be.attention(q, cache.keys[index], cache.values[index], positions,
                                    layer.window, self.scale)
            hidden = hidden + be.linear(attended.reshape(count, q_size), layer.output,
                                        layer.output_bias)
            x = be.rms_norm(hidden, layer.mlp_norm, c.rms_norm_eps)
            gated = be.silu_mul(be.linear(x, layer.gate_up, layer.gate_up_bias))
            hidden = hidden + be.linear(gated, layer.down, layer.down_bias)
        cache.length = start + count
        if rows == "last":
            hidden = hidden[count - 1:count]
        hidden = be.rms_norm(hidden, self.final_norm, c.rms_norm_eps)
        return be.to_host(be.linear(hidden, self.lm_head))
