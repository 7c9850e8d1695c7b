"""GGUF files of the gemma4 family, as llama.cpp's converter writes them (architecture
`gemma4`): their metadata as a Gemma4Config and their tensors under Hugging Face's names.

Invariant: a file reaches the family's builder with the values it stores (norm weights are
stored as the model uses them, with no 1 + w shift) and exactly the config llama.cpp reads from
it: sliding layers from `attention.sliding_window_pattern`, head sizes from
`attention.key_length` (global) and `attention.key_length_swa`, per-layer KV heads and MLP
widths where they are arrays, `attention.shared_kv_layers`, per-layer inputs, experts, and the
global layers' proportional rope from `rope_freqs` (1 for each rotated frequency, a huge factor
for each one left unrotated); global layers with no `attn_v` use their keys as values.
Anything else is refused with the file and the field named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from exactdraft.errors import ConfigError
from exactdraft.models.families.gemma4_config import Gemma4Config, LayerRope, kv_sources
from exactdraft.models.gguf_names import (
    GGUF_ATTENTION,
    GGUFRenamed,
    Part,
    gguf_reader,
    gguf_special_tokens,
)

ARCHITECTURE = "gemma4"
ROPE_FACTORS = "rope_freqs.weight"
UNROTATED = 1e29  # llama.cpp's converter marks an unrotated frequency with a factor of 1e30
NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
         "output_norm.weight": "model.norm.weight",
         "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
         "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
         "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight",
         ROPE_FACTORS: ROPE_FACTORS}
PARTS = {
    **GGUF_ATTENTION,
    **{f"{gguf}.weight": Part(f"{hf}.weight") for gguf, hf in (
        ("post_attention_norm", "post_attention_layernorm"),
        ("ffn_norm", "pre_feedforward_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm"),
        ("pre_ffw_norm_2", "pre_feedforward_layernorm_2"),
        ("post_ffw_norm_1", "post_feedforward_layernorm_1"),
        ("post_ffw_norm_2", "post_feedforward_layernorm_2"),
        ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj"),
        ("ffn_gate_inp", "router.proj"), ("inp_gate", "per_layer_input_gate"),
        ("proj", "per_layer_projection"), ("post_norm", "post_per_layer_input_norm"))},
    "layer_output_scale.weight": Part("layer_scalar"),
    "ffn_gate_inp.scale": Part("router.scale"),
    "ffn_down_exps.scale": Part("router.per_expert_scale"),
}
# Experts stacked [E, rows, K] (gate and up fused, or apart), read one expert at a time so that
# blocks stay blocks.
EXPERTS = {f"ffn_{kind}_exps.weight": Part(f"experts.{{e}}.{kind}_proj.weight")
           for kind in ("gate_up", "gate", "up", "down")}


def per_layer(reader: Any, key: str, layers: int, default: Any = None) -> tuple[int, ...]:
    """A field that is one integer or one per layer."""
    value = reader.value(key, default)
    if isinstance(value, list):
        if len(value) != layers or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                       for v in value):
            raise reader.fail(key, f"must hold a positive integer for each of the {layers} "
                              f"layers, got {value!r}")
        return tuple(int(v) for v in value)
    return (reader.int(key, default),) * layers


def global_rope(reader: Any, tensors: Mapping[str, Any], head_dim: int) -> LayerRope:
    """The global layers' rope: rope.freq_base, with the rotated share rope_freqs gives."""
    theta = reader.float("rope.freq_base", 1000000.0)
    if reader.int("rope.dimension_count", head_dim) != head_dim:
        raise reader.fail("rope.dimension_count", f"differs from the global head size "
                          f"{head_dim}; not supported")
    if ROPE_FACTORS not in tensors:
        return LayerRope(theta)
    factors = np.asarray(tensors[ROPE_FACTORS], dtype=np.float64).reshape(-1)
    angles = int(np.count_nonzero(factors == 1.0))
    if factors.size != head_dim // 2 or np.any(factors[:angles] != 1.0) or \
            np.any(factors[angles:] < UNROTATED):
        raise ConfigError(f"{reader.source}: {ROPE_FACTORS} must be {head_dim // 2} factors, "
                          f"1 for each rotated frequency then {UNROTATED:g} or more for each "
                          "unrotated one; other factors are not supported")
    return LayerRope(theta, rotated_share=2 * angles / head_dim)


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any],
                     source: str) -> Gemma4Config:
    reader = gguf_reader(fields, tensors, source, ARCHITECTURE)
    hidden, heads = reader.int("embedding_length"), reader.int("attention.head_count")
    layers = reader.int("block_count")
    pattern = reader.value("attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) != layers:
        raise reader.fail("attention.sliding_window_pattern", f"must flag each of the {layers} "
                          f"layers as sliding or not, got {pattern!r}")
    sliding = tuple(bool(flag) for flag in pattern)
    full_dim = reader.int("attention.key_length")
    swa_dim = reader.int("attention.key_length_swa")
    for key, dim in (("attention.value_length", full_dim),
                     ("attention.value_length_swa", swa_dim),
                     ("rope.dimension_count_swa", swa_dim)):
        if reader.int(key, dim) != dim:
            raise reader.fail(key, f"differs from the head size {dim}; not supported")
    kv_heads = per_layer(reader, "attention.head_count_kv", layers, heads)
    sources = kv_sources(reader, sliding, reader.int("attention.shared_kv_layers", 0, 0),
                         "attention.shared_kv_layers")
    widths = per_layer(reader, "feed_forward_length", layers)
    double = widths != (widths[0],) * layers
    if double and widths != tuple(widths[0] * (1 if sources[i] == i else 2)
                                  for i in range(layers)):
        raise reader.fail("feed_forward_length", f"{list(widths)} is neither one width nor "
                          "twice the width for the layers that read shared keys")
    if any(heads % count for count in kv_heads):
        raise reader.fail("attention.head_count_kv", f"{list(kv_heads)} does not divide the "
                          f"{heads} query heads")
    first_global = next(i for i in range(layers) if not sliding[i])
    per_layer_size = reader.int("embedding_length_per_layer_input", 0, minimum=0)
    experts = reader.int("expert_count", 0, minimum=0)
    if experts and reader.int("expert_used_count") > experts:
        raise reader.fail("expert_used_count", f"({reader.int('expert_used_count')}) exceeds "
                          f"the {experts} experts")
    return Gemma4Config(
        model_type="gemma4_text", source=source,
        vocab_size=int(tensors.shape("token_embd.weight")[0]), hidden_size=hidden,
        intermediate_size=widths[0], num_layers=layers, num_heads=heads, sliding=sliding,
        head_dims=tuple(swa_dim if s else full_dim for s in sliding), kv_heads=kv_heads,
        kv_sources=sources, sliding_window=reader.int("attention.sliding_window"),
        ropes=(LayerRope(reader.float("rope.freq_base_swa", 10000.0)),
               global_rope(reader, tensors, full_dim)),
        rms_norm_eps=reader.float("attention.layer_norm_rms_epsilon", 1e-6),
        max_position_embeddings=reader.int("context_length", 131072),
        tie_word_embeddings="output.weight" not in tensors,
        keys_are_values=f"blk.{first_global}.attn_v.weight" not in tensors,
        double_wide_mlp=double, per_layer_size=per_layer_size,
        per_layer_vocab=int(tensors.shape("per_layer_token_embd.weight")[0])
        if per_layer_size else 0,
        num_experts=experts, top_k=reader.int("expert_used_count") if experts else 0,
        expert_size=reader.int("expert_feed_forward_length") if experts else 0,
        final_logit_softcapping=reader.float("final_logit_softcapping", None),
        **gguf_special_tokens(fields, source))


def gguf_tensors(config: Gemma4Config, tensors: Any, source: str) -> GGUFRenamed:
    return GGUFRenamed(tensors, source, NAMES, {**PARTS, **EXPERTS},
                       lambda i: f"model.layers.{i}.")
