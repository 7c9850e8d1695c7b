"""The GLM-4.5 family (glm4_moe: GLM-4.5, GLM-4.5-Air, GLM-4.6): config mapping, tensor names
and the model (a decoder of grouped-query attention and mixture-of-experts layers, with the
checkpoint's MTP layer as an MTPHead).

Invariant: a checkpoint reaches DecoderModel with the values it stores under Hugging Face's
names and with the family's choices explicit: attention with biases on q, k and v (none on
o_proj) where `attention_bias`, per-head q/k RMS norms where `use_qk_norm`, and a rope on the
first `partial_rotary_factor * head_dim` dimensions of each head (rotate-half pairs within
them; mixers.py's rotary permutation); the first `first_k_dense_replace` layers have a dense
MLP and the rest DeepSeek-V3's routing and experts (sigmoid_moe.py).

The first of the `num_nextn_predict_layers` layers stored after the trunk (`model.layers.{L}.`,
with enorm, hnorm, eh_proj and shared_head beside the layer's own tensors) becomes the MTPHead
drafting for it (nextn_head.py).

GGUF files: llama.cpp's `glm4moe` architecture (its rope is rotate-half, so q and k rows are
stored as Hugging Face has them); experts come stacked (`ffn_gate_exps` [E, I, H], ...) and
are sliced one per expert; the MTP layer's tensors are `blk.{L}.nextn.*` beside its layer's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exactdraft.models import gguf_names
from exactdraft.models.blocks import RopeTable, rope_frequencies
from exactdraft.models.config import ConfigReader, rope_theta_from_hf
from exactdraft.models.decoder import DecoderModel, HeadShape
from exactdraft.models.families.registry import Family
from exactdraft.models.layer import Layer
from exactdraft.models.mixers import load_attention, rotary_frequencies
from exactdraft.models.routed_decoder import (
    GGUF_GLOBALS,
    ROUTED_GGUF_PARTS,
    routed_layer,
    routed_trunk,
)
from exactdraft.models.sigmoid_moe import (
    SigmoidRouting,
    sigmoid_routing_from_gguf,
    sigmoid_routing_from_hf,
    stored_sigmoid_experts,
)
from exactdraft.models.split import TensorParallelSplit
from exactdraft.models.tensors import TensorReader


@dataclass(frozen=True)
class Glm4MoeConfig:
    source: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # of the dense layers
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]
    routing: SigmoidRouting
    mtp_layers: int = 0


def rotary_size(reader: ConfigReader, head_dim: int) -> int:
    """partial_rotary_factor * head_dim (the factor in rope_parameters, or beside it in older
    files; GLM's default 0.5), refused unless it is even and within the head."""
    parameters = reader.value("rope_parameters", {}) or {}
    if not isinstance(parameters, Mapping):
        raise reader.fail("rope_parameters", f"must be an object, got {parameters!r}")
    if parameters.get("rope_type", parameters.get("type", "default")) != "default":
        raise reader.fail("rope_parameters", "has a scaled rope, which is not supported")
    factor = parameters.get("partial_rotary_factor") or \
        reader.float("partial_rotary_factor", 0.5)
    size = int(head_dim * factor) if isinstance(factor, (int, float)) else 0
    if size <= 0 or size > head_dim or size % 2:
        raise reader.fail("partial_rotary_factor", f"{factor!r} gives no even rotary size "
                          f"within head_dim {head_dim}")
    return size


def config_from_hf(raw: Mapping[str, Any], source: str) -> Glm4MoeConfig:
    reader = ConfigReader(raw, source)
    if reader.value("hidden_act", "silu") not in ("silu", "swish"):
        raise reader.fail("hidden_act", "is not supported; supported: silu")
    hidden = reader.int("hidden_size")
    heads = reader.int("num_attention_heads")
    kv_heads = reader.int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise reader.fail("num_key_value_heads", f"({kv_heads}) does not divide the {heads} "
                          "attention heads")
    head_dim = reader.int("head_dim", hidden // heads)
    return Glm4MoeConfig(
        source=source, vocab_size=reader.int("vocab_size"), hidden_size=hidden,
        intermediate_size=reader.int("intermediate_size"),
        num_layers=reader.int("num_hidden_layers"), num_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim, rotary_dim=rotary_size(reader, head_dim),
        rms_norm_eps=reader.float("rms_norm_eps", 1e-5), rope_theta=rope_theta_from_hf(reader),
        max_position_embeddings=reader.int("max_position_embeddings", 131072),
        tie_word_embeddings=reader.bool("tie_word_embeddings", False),
        attention_bias=reader.bool("attention_bias", False),
        qk_norm=reader.bool("use_qk_norm", False),
        eos_token_ids=reader.token_ids("eos_token_id"), routing=sigmoid_routing_from_hf(reader),
        mtp_layers=reader.int("num_nextn_predict_layers", 0, minimum=0))


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any],
                     source: str) -> Glm4MoeConfig:
    """llama.cpp's glm4moe metadata: block_count counts the MTP layers stored after the trunk
    (nextn_predict_layers); the rope covers rope.dimension_count dimensions of each head."""
    reader = gguf_names.gguf_reader(fields, tensors, source, "glm4moe")
    hidden = reader.int("embedding_length")
    heads = reader.int("attention.head_count")
    mtp = reader.int("nextn_predict_layers", 0, minimum=0)
    layers = reader.int("block_count", minimum=mtp + 1) - mtp
    head_dim = gguf_names.gguf_head_dim(reader, hidden, heads)
    rotary = reader.int("rope.dimension_count", head_dim)
    if rotary > head_dim or rotary % 2:
        raise reader.fail("rope.dimension_count", f"({rotary}) is not an even size within "
                          f"head_dim {head_dim}")
    routing = sigmoid_routing_from_gguf(reader, gating=2, normalize=True)
    return Glm4MoeConfig(
        source=source, vocab_size=int(tensors.shape("token_embd.weight")[0]),
        hidden_size=hidden, intermediate_size=reader.int("feed_forward_length"),
        num_layers=layers, num_heads=heads,
        num_kv_heads=reader.int("attention.head_count_kv", heads), head_dim=head_dim,
        rotary_dim=rotary, rms_norm_eps=reader.float("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=reader.float("rope.freq_base", 10000.0),
        max_position_embeddings=reader.int("context_length", 131072),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        eos_token_ids=gguf_names.gguf_special_tokens(fields, source)["eos_token_ids"],
        routing=routing, mtp_layers=mtp)


GGUF_PARTS = {**gguf_names.GGUF_ATTENTION, **ROUTED_GGUF_PARTS,
              "post_attention_norm.weight": gguf_names.Part("post_attention_layernorm.weight")}


def gguf_tensors(config: Glm4MoeConfig, tensors: Mapping[str, Any],
                 source: str) -> gguf_names.GGUFRenamed:
    return gguf_names.GGUFRenamed(tensors, source, GGUF_GLOBALS, GGUF_PARTS,
                                  lambda i: f"model.layers.{i}.")


def decoder_layer(be: Any, reader: TensorReader, prefix: str, c: Glm4MoeConfig, index: int,
                  kv_slot: int, rope: RopeTable) -> Layer:
    hidden = c.hidden_size
    attention = load_attention(
        be, reader, prefix + "self_attn.", hidden=hidden, heads=c.num_heads,
        kv_heads=c.num_kv_heads, head_dim=c.head_dim, kv_slot=kv_slot, eps=c.rms_norm_eps,
        rope=rope, rotary_dim=c.rotary_dim, qk_norm=c.qk_norm, bias=c.attention_bias,
        output_bias=False)
    return routed_layer(be, reader, prefix, index, attention, hidden=hidden,
                        dense_size=c.intermediate_size, routing=c.routing)


def build(config: Glm4MoeConfig, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> DecoderModel:
    c, be = config, backend
    reader = TensorReader(tensors, c.source)
    rope = RopeTable(rotary_frequencies(c.head_dim, c.rotary_dim,
                                        rope_frequencies(c.rotary_dim, c.rope_theta, None)))
    trunk = routed_trunk(
        be, reader, c, lambda prefix, index, slot: decoder_layer(be, reader, prefix, c, index,
                                                                 slot, rope),
        model_type="glm4_moe", num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
        max_context=max_context,
        head_shape=HeadShape(str(c.source), c.hidden_size, c.num_heads, c.num_kv_heads,
                             c.head_dim, c.intermediate_size, c.rms_norm_eps, c.rope_theta))
    return DecoderModel(trunk, be, max_context)


def stored_experts(be: Any, reader: TensorReader, c: Glm4MoeConfig, index: int,
                   count: int) -> list[Any]:
    """Layer `index`'s first `count` routed experts as stored (a tensor-parallel rank's)."""
    return stored_sigmoid_experts(be, reader, f"model.layers.{index}.mlp.", c.hidden_size,
                                  c.routing, count)


FAMILY = Family(
    name="glm4_moe",
    model_types=("glm4_moe",),
    gguf_architectures=("glm4moe",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: tensors,
    gguf_tensors=gguf_tensors,
    build=build,
    tensor_parallel=lambda config: TensorParallelSplit(experts=stored_experts),
)
