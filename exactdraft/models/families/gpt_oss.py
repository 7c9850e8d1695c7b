"""The gpt-oss family: config mapping, tensor names and the model (a DecoderModel of attention
layers with sinks and mixture-of-experts feed-forwards).

Invariant: a gpt-oss checkpoint reaches DecoderModel with the values it stores under Hugging
Face's names and with the family's choices made explicit: attention with biases and a sink per
query head (models/attention_sinks.py; a backend whose attention takes no sinks is refused),
sliding-window and full layers as `layer_types` says (alternating, sliding first, when it
says nothing), YaRN rope with its attention factor on
cos and sin (models/yarn.py), and experts with a biased router, top-k over the softmax of
the chosen logits and a clamped SwiGLU with biases (models/clamped_experts.py). A state is its
KV cache alone (prefixes export and import), and token trees verify in one pass.

GGUF files: llama.cpp's `gpt-oss` architecture (`attn_sinks`, `post_attention_norm`, the
router's `ffn_gate_inp` weight and bias, experts stacked [E, rows, K] with their biases [E,
rows], gate and up apart; MXFP4 experts stay in their blocks), with llama.cpp's settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exactdraft.backends.sinks import require_attention_sinks
from exactdraft.models.attention_sinks import SinkAttention
from exactdraft.models.clamped_experts import BiasedRouterMoE, load_clamped_experts
from exactdraft.models.config import ConfigReader
from exactdraft.models.decoder import DecoderModel, HeadShape, Trunk
from exactdraft.models.families.registry import Family
from exactdraft.models.gguf_names import (
    GGUF_ATTENTION,
    GGUFRenamed,
    Part,
    gguf_head_dim,
    gguf_reader,
    gguf_special_tokens,
)
from exactdraft.models.layer import Layer
from exactdraft.models.mixers import load_attention, norm_vector
from exactdraft.models.moe import RouterSettings
from exactdraft.models.split import TensorParallelSplit
from exactdraft.models.tensors import TensorReader
from exactdraft.models.yarn import YarnScaling, yarn_from_hf, yarn_mscale, yarn_rope


@dataclass(frozen=True)
class GptOssConfig:
    model_type: str
    source: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    yarn: YarnScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    sliding_windows: tuple[int, ...]
    eos_token_ids: tuple[int, ...]
    num_experts: int
    top_k: int
    expert_size: int
    swiglu_alpha: float
    swiglu_limit: float


def config_from_hf(raw: Mapping[str, Any], source: str) -> GptOssConfig:
    reader = ConfigReader(raw, source)
    hidden, heads, layers, experts, top_k = _sizes(reader, (
        "hidden_size", "num_attention_heads", "num_hidden_layers", "num_local_experts",
        "num_experts_per_tok"))
    kv_heads = reader.int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise reader.fail("num_attention_heads", f"({heads}) is not a multiple of the "
                          f"{kv_heads} KV heads")
    theta, yarn = _rope_from_hf(reader)
    return GptOssConfig(
        model_type="gpt_oss", source=source, vocab_size=reader.int("vocab_size"),
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=reader.int("head_dim", hidden // heads),
        rms_norm_eps=reader.float("rms_norm_eps", 1e-5), rope_theta=theta, yarn=yarn,
        max_position_embeddings=reader.int("max_position_embeddings", 131072),
        tie_word_embeddings=reader.bool("tie_word_embeddings", False),
        attention_bias=reader.bool("attention_bias", True),
        sliding_windows=_windows(reader, layers), eos_token_ids=reader.token_ids("eos_token_id"),
        num_experts=experts, top_k=top_k, expert_size=reader.int("intermediate_size"),
        swiglu_alpha=reader.float("swiglu_alpha", 1.702),
        swiglu_limit=reader.float("swiglu_limit", 7.0))


def _sizes(reader: ConfigReader, keys: tuple[str, ...]) -> tuple[int, ...]:
    """(hidden, heads, layers, experts, top-k) under the file's keys, the top-k checked."""
    hidden, heads, layers, experts, top_k = (reader.int(key) for key in keys)
    if top_k > experts:
        raise reader.fail(keys[-1], f"({top_k}) exceeds the {experts} experts")
    return hidden, heads, layers, experts, top_k


def _windows(reader: ConfigReader, layers: int) -> tuple[int, ...]:
    window = reader.int("sliding_window", 128, minimum=0)
    kinds = reader.value("layer_types", None)
    if kinds is None:
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or any(
            kind not in ("sliding_attention", "full_attention") for kind in kinds):
        raise reader.fail("layer_types", f"must list sliding_attention or full_attention for "
                          f"each of the {layers} layers, got {kinds!r}")
    return tuple(window if kind == "sliding_attention" else 0 for kind in kinds)


def _rope_from_hf(reader: ConfigReader) -> tuple[float, YarnScaling | None]:
    """(base, YaRN scaling or None) from `rope_parameters` (transformers 5) or the legacy
    rope_theta / rope_scaling."""
    parameters = reader.value("rope_parameters", None) or reader.value("rope_scaling", None) \
        or {}
    if not isinstance(parameters, Mapping):
        raise reader.fail("rope_parameters", f"must be an object, got {parameters!r}")
    rope = ConfigReader(parameters, reader.source)
    theta = rope.float("rope_theta", reader.float("rope_theta", 150000.0))
    rope_type = rope.value("rope_type", rope.value("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "yarn":
        raise rope.fail("rope_type", f"{rope_type!r} is not supported for gpt_oss; supported: "
                        "yarn, default")
    return theta, yarn_from_hf(reader)


def build(config: GptOssConfig, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> DecoderModel:
    c, be = config, backend
    require_attention_sinks(be, f"gpt-oss model {c.source}")
    reader = TensorReader(tensors, c.source)
    hidden = c.hidden_size
    rope = yarn_rope(c.head_dim, c.rope_theta, c.yarn)
    settings = RouterSettings(c.num_experts, c.top_k, normalize=True)
    layers = []
    for i in range(c.num_layers):
        layer = f"model.layers.{i}."
        attention = load_attention(
            be, reader, layer + "self_attn.", hidden=hidden, heads=c.num_heads,
            kv_heads=c.num_kv_heads, head_dim=c.head_dim, kv_slot=i, eps=c.rms_norm_eps,
            rope=rope, bias=c.attention_bias, window=c.sliding_windows[i])
        sinks = reader.array(layer + "self_attn.sinks", (c.num_heads,))
        moe = layer + "mlp."
        feed_forward = BiasedRouterMoE(
            entry=be.matrix(reader.get(moe + "router.weight", (c.num_experts, hidden))),
            settings=settings,
            experts=load_clamped_experts(be, reader, moe + "experts.", c.num_experts, hidden,
                                         c.expert_size, c.swiglu_alpha, c.swiglu_limit),
            entry_bias=be.vector(reader.array(moe + "router.bias", (c.num_experts,))))
        layers.append(Layer(
            norm_vector(be, reader, layer + "input_layernorm.weight", hidden),
            SinkAttention(attention, sinks),
            norm_vector(be, reader, layer + "post_attention_layernorm.weight", hidden),
            feed_forward))
    embedding = reader.array("model.embed_tokens.weight", (c.vocab_size, hidden))
    head = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    output = reader.get(head, (c.vocab_size, hidden))
    trunk = Trunk(
        model_type=c.model_type, source=c.source, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, eos_token_ids=c.eos_token_ids,
        eps=c.rms_norm_eps, hidden_size=hidden, embedding=embedding,
        final_norm=norm_vector(be, reader, "model.norm.weight", hidden),
        lm_head=be.matrix(output), layers=layers,
        kv_layers=c.num_layers, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
        digest=reader.digest, output_table=lambda: output, config=c,
        head_shape=HeadShape(str(c.source), hidden, c.num_heads, c.num_kv_heads, c.head_dim,
                             c.expert_size, c.rms_norm_eps, c.rope_theta),
        kv_prefixes=True, verifies_trees=True)
    return DecoderModel(trunk, be, max_context)


GGUF_ARCHITECTURE = "gpt-oss"
GGUF_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
              "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
GGUF_PARTS = {
    **GGUF_ATTENTION,
    "attn_sinks.weight": Part("self_attn.sinks"),
    "post_attention_norm.weight": Part("post_attention_layernorm.weight"),
    "ffn_gate_inp.weight": Part("mlp.router.weight"),
    "ffn_gate_inp.bias": Part("mlp.router.bias"),
    **{f"ffn_{kind}_exps.{what}": Part(f"mlp.experts.{{e}}.{kind}_proj.{what}")
       for kind in ("gate", "up", "down") for what in ("weight", "bias")},
}


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any],
                     source: str) -> GptOssConfig:
    """llama.cpp's gpt-oss metadata, read as llama.cpp reads it: even layers slide, YaRN's
    ramp bounds are rounded outwards (floor and ceil), alpha and limit are 1.702 and 7."""
    reader = gguf_reader(fields, tensors, source, GGUF_ARCHITECTURE)
    hidden, heads, layers, experts, top_k = _sizes(reader, (
        "embedding_length", "attention.head_count", "block_count", "expert_count",
        "expert_used_count"))
    window = reader.int("attention.sliding_window", 0, minimum=0)
    kind = reader.value("rope.scaling.type", None)
    yarn = None
    if kind == "yarn":
        factor = reader.float("rope.scaling.factor")
        yarn = YarnScaling(factor, reader.int("rope.scaling.original_context_length"),
                           beta_fast=reader.float("rope.scaling.yarn_beta_fast", 32.0),
                           beta_slow=reader.float("rope.scaling.yarn_beta_slow", 1.0),
                           truncate=True, attention_factor=yarn_mscale(factor, 1.0))
    elif kind not in (None, "none"):
        raise reader.fail("rope.scaling.type", f"{kind!r} is not supported; supported: yarn")
    return GptOssConfig(
        model_type="gpt_oss", source=source,
        vocab_size=int(tensors.shape("token_embd.weight")[0]), hidden_size=hidden,
        num_layers=layers, num_heads=heads,
        num_kv_heads=reader.int("attention.head_count_kv", heads),
        head_dim=gguf_head_dim(reader, hidden, heads),
        rms_norm_eps=reader.float("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=reader.float("rope.freq_base", 150000.0), yarn=yarn,
        max_position_embeddings=reader.int("context_length", 131072),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        sliding_windows=tuple(window if i % 2 == 0 else 0 for i in range(layers)),
        eos_token_ids=gguf_special_tokens(fields, source)["eos_token_ids"],
        num_experts=experts, top_k=top_k,
        expert_size=reader.int("expert_feed_forward_length"), swiglu_alpha=1.702,
        swiglu_limit=7.0)


def gguf_tensors(config: GptOssConfig, tensors: Mapping[str, Any], source: str) -> GGUFRenamed:
    return GGUFRenamed(tensors, source, GGUF_NAMES, GGUF_PARTS, lambda i: f"model.layers.{i}.")


FAMILY = Family(
    name="gpt_oss",
    model_types=("gpt_oss",),
    gguf_architectures=(GGUF_ARCHITECTURE,),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: tensors,
    gguf_tensors=gguf_tensors,
    build=build,
    # Every matrix by output columns (experts too), attention with every head on every rank:
    # the sinks then scale whole heads as at TP=1.
    tensor_parallel=lambda config: TensorParallelSplit(),
)
