"""The transformer layers of the llama and gemma3 families: where their tensors are
(TensorNames) and the Trunk built from a DecoderConfig.

Invariant: the weights are checked by name and shape against the config before anything is
built, so a bad checkpoint fails with the tensor named; each layer is an attention mixer and a
gated dense feed-forward exactly as the DecoderLayer docstring describes (q, k, v stacked into
one matrix, gate and up into another, biases and norms only where the config has them), so a
backend that fuses layers runs every layer fused; and the weights digest covers exactly the
tensors the config calls for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend
from exactdraft.formats.table import stack_rows
from exactdraft.models.blocks import RopeTable, rope_frequencies
from exactdraft.models.config import DecoderConfig
from exactdraft.models.decoder import DecoderModel, Trunk, check_max_context
from exactdraft.models.layer import Layer
from exactdraft.models.mixers import AttentionMixer, DenseMLP
from exactdraft.models.tensors import check_shapes, tensor_shape, weights_digest


@dataclass(frozen=True)
class TensorNames:
    """Where a family keeps each weight, as Hugging Face names; "{i}" is the layer index and a
    projection is named without its ".weight" / ".bias" suffix. None: the family has none."""

    embedding: str = "model.embed_tokens.weight"
    final_norm: str = "model.norm.weight"
    lm_head: str = "lm_head.weight"
    attention_norm: str = "model.layers.{i}.input_layernorm.weight"
    q: str = "model.layers.{i}.self_attn.q_proj"
    k: str = "model.layers.{i}.self_attn.k_proj"
    v: str = "model.layers.{i}.self_attn.v_proj"
    output: str = "model.layers.{i}.self_attn.o_proj"
    q_norm: str = "model.layers.{i}.self_attn.q_norm.weight"
    k_norm: str = "model.layers.{i}.self_attn.k_norm.weight"
    post_attention_norm: str | None = None
    mlp_norm: str = "model.layers.{i}.post_attention_layernorm.weight"
    gate: str = "model.layers.{i}.mlp.gate_proj"
    up: str = "model.layers.{i}.mlp.up_proj"
    down: str = "model.layers.{i}.mlp.down_proj"
    post_mlp_norm: str | None = None

    def expected_shapes(self, c: DecoderConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor the config calls for, with its shape."""
        q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        shapes = {self.embedding: (c.vocab_size, c.hidden_size), self.final_norm: (c.hidden_size,)}
        if not c.tie_word_embeddings:
            shapes[self.lm_head] = (c.vocab_size, c.hidden_size)
        for i in range(c.num_layers):
            def name(template: str, suffix: str = "", i: int = i) -> str:
                return template.format(i=i) + suffix

            shapes[name(self.attention_norm)] = (c.hidden_size,)
            shapes[name(self.mlp_norm)] = (c.hidden_size,)
            if c.sandwich_norms:
                shapes[name(self.post_attention_norm)] = (c.hidden_size,)
                shapes[name(self.post_mlp_norm)] = (c.hidden_size,)
            for template, out in ((self.q, q_out), (self.k, kv_out), (self.v, kv_out)):
                shapes[name(template, ".weight")] = (out, c.hidden_size)
                if c.attention_bias:
                    shapes[name(template, ".bias")] = (out,)
            shapes[name(self.output, ".weight")] = (c.hidden_size, q_out)
            if c.attention_output_bias:
                shapes[name(self.output, ".bias")] = (c.hidden_size,)
            if c.qk_norm:
                shapes[name(self.q_norm)] = (c.head_dim,)
                shapes[name(self.k_norm)] = (c.head_dim,)
            for template, shape in ((self.gate, (c.intermediate_size, c.hidden_size)),
                                    (self.up, (c.intermediate_size, c.hidden_size)),
                                    (self.down, (c.hidden_size, c.intermediate_size))):
                shapes[name(template, ".weight")] = shape
                if c.mlp_bias:
                    shapes[name(template, ".bias")] = shape[:1]
        return shapes


def transformer_trunk(config: DecoderConfig, tensors: Mapping[str, Any], backend: Backend,
                      names: TensorNames = TensorNames()) -> Trunk:
    """The checked, backend-prepared layers of a DecoderConfig's model (module invariant)."""
    c, be = config, backend
    expected = names.expected_shapes(c)
    check_shapes(expected, lambda name: tensor_shape(tensors, name), c.source)
    head = names.embedding if c.tie_word_embeddings else names.lm_head
    lm_head = be.matrix(tensors[head])
    final_norm = be.vector(tensors[names.final_norm])
    global_rope = RopeTable(rope_frequencies(c.head_dim, c.rope_theta, c.rope_scaling))
    # Sliding layers read a rope of their own base (unscaled) where the config gives one.
    local_rope = global_rope if c.local_rope_theta is None else \
        RopeTable(rope_frequencies(c.head_dim, c.local_rope_theta, None))

    def layer(index: int) -> Layer:
        def name(template: str | None, suffix: str = "") -> str | None:
            return None if template is None else template.format(i=index) + suffix

        def vector(template: str | None) -> Any | None:
            full = name(template)
            return be.vector(tensors[full]) if full in expected else None

        def matrix(templates: Sequence[str]) -> Any:
            return be.matrix(stack_rows([tensors[name(t, ".weight")] for t in templates]))

        def bias(templates: Sequence[str]) -> Any | None:
            full_names = [name(t, ".bias") for t in templates]
            if not all(full in expected for full in full_names):
                return None
            return be.vector(np.concatenate([np.asarray(tensors[full], dtype=np.float32)
                                             for full in full_names]))

        n, window = names, c.sliding_windows[index]
        qkv, gate_up = (n.q, n.k, n.v), (n.gate, n.up)
        attention_norm = vector(n.attention_norm)
        attention = AttentionMixer(
            qkv=matrix(qkv), qkv_bias=bias(qkv), output=matrix((n.output,)),
            output_bias=bias((n.output,)), q_norm=vector(n.q_norm), k_norm=vector(n.k_norm),
            num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
            kv_slot=index, eps=c.rms_norm_eps, scale=c.scale, window=window,
            rope=local_rope if window else global_rope)
        post_attention_norm = vector(n.post_attention_norm) if c.sandwich_norms else None
        mlp_norm = vector(n.mlp_norm)
        mlp = DenseMLP(gate_up=matrix(gate_up), gate_up_bias=bias(gate_up),
                       down=matrix((n.down,)), down_bias=bias((n.down,)),
                       activation=c.activation, inner_size=c.intermediate_size)
        return Layer(attention_norm, attention, mlp_norm, mlp, post_attention_norm,
                     vector(n.post_mlp_norm) if c.sandwich_norms else None)

    return Trunk(
        model_type=c.model_type, source=c.source, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, eos_token_ids=c.eos_token_ids,
        eps=c.rms_norm_eps, hidden_size=c.hidden_size,
        embedding=tensors[names.embedding],  # on the host: rows are taken per pass
        final_norm=final_norm, lm_head=lm_head,
        layers=[layer(i) for i in range(c.num_layers)], kv_layers=c.num_layers,
        num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
        digest=lambda: weights_digest(tensors, expected),
        # A draft head copies the layer `config` describes (no head_shape needed).
        output_table=lambda: tensors[head], embedding_scale=c.embedding_scale, config=c,
        kv_prefixes=True, verifies_trees=True)


def transformer_model(config: DecoderConfig, tensors: Mapping[str, Any], backend: Backend,
                      max_context: int | None = None,
                      names: TensorNames = TensorNames()) -> DecoderModel:
    check_max_context(max_context)
    return DecoderModel(transformer_trunk(config, tensors, backend, names), backend,
                        max_context)
