"""The DeepSeek-V3 family (deepseek_v3: DeepSeek-V3, R1, and the checkpoints that share its
layout): config mapping, tensor names and the model (a decoder of multi-head latent attention
and mixture-of-experts layers, with the checkpoint's MTP layer as an MTPHead).

Invariant: a checkpoint reaches the model with the values it stores under Hugging Face's names
and with the family's choices explicit: every layer is multi-head latent attention
(latent_attention.py) with the yarn rope of `rope_parameters` (yarn.py: scaled frequencies, cos
and sin times the attention factor, the score scale qk_head_dim^-0.5 times
mscale(factor, mscale_all_dim)^2); the first `first_k_dense_replace` layers have a dense MLP
and the rest sigmoid_moe.py's experts. The cache holds per token and layer the latent and the
rope key (kv_lora_rank + qk_rope_head_dim values), not per-head keys and values.

The first of the `num_nextn_predict_layers` layers stored after the trunk (`model.layers.{L}.`,
with enorm, hnorm, eh_proj and shared_head.norm / shared_head.head beside the layer's own
tensors) becomes the MTPHead drafting for it (nextn_head.py), run as the trunk's layers are.

GGUF files: llama.cpp's `deepseek2` architecture (DeepSeek-V3 and R1 as its converter writes
them: kv_b_proj split into attn_k_b, transposed per head, and attn_v_b; rope pairs left
interleaved; experts stacked; the yarn attention scale from rope.scaling.yarn_log_multiplier;
no MTP layer, which the converter drops).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exactdraft.models import gguf_names
from exactdraft.models.config import ConfigReader, rope_theta_from_hf
from exactdraft.models.families.registry import Family
from exactdraft.models.gguf_names import Part
from exactdraft.models.latent_attention import LatentDecoderModel, load_latent_attention
from exactdraft.models.layer import Layer
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
from exactdraft.models.yarn import (
    YarnScaling,
    yarn_from_gguf,
    yarn_from_hf,
    yarn_rope,
    yarn_score_scale,
)


@dataclass(frozen=True)
class DeepseekV3Config:
    source: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int  # of the dense layers
    num_layers: int
    num_heads: int
    q_lora_rank: int  # 0: q_proj directly
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool
    rms_norm_eps: float
    rope_theta: float
    yarn: YarnScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    eos_token_ids: tuple[int, ...]
    routing: SigmoidRouting
    mtp_layers: int = 0

    @property
    def cache_width(self) -> int:
        """Values the cache holds per token and layer: the latent and the rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


def config_from_hf(raw: Mapping[str, Any], source: str) -> DeepseekV3Config:
    reader = ConfigReader(raw, source)
    if reader.value("hidden_act", "silu") not in ("silu", "swish"):
        raise reader.fail("hidden_act", "is not supported; supported: silu")
    rope_dim = reader.int("qk_rope_head_dim")
    if rope_dim % 2:
        raise reader.fail("qk_rope_head_dim", f"must be even, got {rope_dim}")
    return DeepseekV3Config(
        source=source, vocab_size=reader.int("vocab_size"),
        hidden_size=reader.int("hidden_size"), intermediate_size=reader.int("intermediate_size"),
        num_layers=reader.int("num_hidden_layers"), num_heads=reader.int("num_attention_heads"),
        q_lora_rank=reader.int("q_lora_rank", 0, minimum=0),
        kv_lora_rank=reader.int("kv_lora_rank"),
        qk_nope_head_dim=reader.int("qk_nope_head_dim"), qk_rope_head_dim=rope_dim,
        v_head_dim=reader.int("v_head_dim"),
        rope_interleave=reader.bool("rope_interleave", True),
        rms_norm_eps=reader.float("rms_norm_eps", 1e-6), rope_theta=rope_theta_from_hf(reader),
        yarn=yarn_from_hf(reader),
        max_position_embeddings=reader.int("max_position_embeddings", 4096),
        tie_word_embeddings=reader.bool("tie_word_embeddings", False),
        attention_bias=reader.bool("attention_bias", False),
        eos_token_ids=reader.token_ids("eos_token_id"),
        routing=sigmoid_routing_from_hf(reader),
        mtp_layers=reader.int("num_nextn_predict_layers", 0, minimum=0))


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any],
                     source: str) -> DeepseekV3Config:
    """llama.cpp's deepseek2 metadata. Its converter writes the latent attention as one key
    head: key_length = kv_lora_rank + rope, the per-head sizes as key_length_mla and
    value_length_mla (older files: key_length and value_length are the per-head sizes); rope
    pairs stay interleaved as DeepSeek stores them; a file without expert_gating_func is a
    softmax-routed DeepSeek-V2, refused."""
    reader = gguf_names.gguf_reader(fields, tensors, source, "deepseek2")
    mtp = reader.int("nextn_predict_layers", 0, minimum=0)
    rope_dim = reader.int("rope.dimension_count")
    if rope_dim % 2:
        raise reader.fail("rope.dimension_count", f"must be even, got {rope_dim}")
    if reader.has("attention.key_length_mla"):
        nope = reader.int("attention.key_length_mla", minimum=rope_dim + 1) - rope_dim
        value_dim = reader.int("attention.value_length_mla")
    else:
        nope = reader.int("attention.key_length", minimum=rope_dim + 1) - rope_dim
        value_dim = reader.int("attention.value_length")
    routing = sigmoid_routing_from_gguf(reader, gating=1, normalize=False)
    return DeepseekV3Config(
        source=source, vocab_size=int(tensors.shape("token_embd.weight")[0]),
        hidden_size=reader.int("embedding_length"),
        intermediate_size=reader.int("feed_forward_length"),
        num_layers=reader.int("block_count", minimum=mtp + 1) - mtp,
        num_heads=reader.int("attention.head_count"),
        q_lora_rank=reader.int("attention.q_lora_rank", 0, minimum=0),
        kv_lora_rank=reader.int("attention.kv_lora_rank"), qk_nope_head_dim=nope,
        qk_rope_head_dim=rope_dim, v_head_dim=value_dim, rope_interleave=True,
        rms_norm_eps=reader.float("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=reader.float("rope.freq_base", 10000.0), yarn=yarn_from_gguf(reader),
        max_position_embeddings=reader.int("context_length", 4096),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_kv_a_mqa.bias" in tensors,
        eos_token_ids=gguf_names.gguf_special_tokens(fields, source)["eos_token_ids"],
        routing=routing, mtp_layers=mtp)


# llama.cpp's latent attention tensors (the part after `blk.N.`) -> names under the layer.
GGUF_PARTS = {
    **ROUTED_GGUF_PARTS,
    "attn_norm.weight": Part("input_layernorm.weight"),
    "ffn_norm.weight": Part("post_attention_layernorm.weight"),
    **{f"attn_{gguf}.{kind}": Part(f"self_attn.{hf}.{kind}") for gguf, hf in (
        ("q_a", "q_a_proj"), ("q_b", "q_b_proj"), ("q", "q_proj"),
        ("kv_a_mqa", "kv_a_proj_with_mqa"), ("kv_b", "kv_b_proj"), ("output", "o_proj"))
       for kind in ("weight", "bias")},
    "attn_q_a_norm.weight": Part("self_attn.q_a_layernorm.weight"),
    "attn_kv_a_norm.weight": Part("self_attn.kv_a_layernorm.weight"),
    # [heads, rows, K] as one matrix [heads * rows, K]
    **{f"attn_{half}_b.weight": Part(f"self_attn.{half}_b_proj.weight",
                                     shape=lambda s: (s[0] * s[1], s[2]))
       for half in ("k", "v")},
}


def gguf_tensors(config: DeepseekV3Config, tensors: Mapping[str, Any],
                 source: str) -> gguf_names.GGUFRenamed:
    return gguf_names.GGUFRenamed(tensors, source, GGUF_GLOBALS, GGUF_PARTS,
                                  lambda i: f"model.layers.{i}.")


def decoder_layer(be: Any, reader: TensorReader, prefix: str, c: DeepseekV3Config,
                  index: int, kv_slot: int, rope: Any) -> Layer:
    """Layer `index` of the checkpoint (its MLP dense below first_k_dense_replace), stored
    under `prefix`, its cache in `kv_slot`."""
    hidden = c.hidden_size
    attention = load_latent_attention(
        be, reader, prefix + "self_attn.", hidden=hidden, heads=c.num_heads,
        q_rank=c.q_lora_rank, latent_dim=c.kv_lora_rank, nope_dim=c.qk_nope_head_dim,
        rope_dim=c.qk_rope_head_dim, value_dim=c.v_head_dim, kv_slot=kv_slot,
        eps=c.rms_norm_eps, rope=rope, interleaved=c.rope_interleave, bias=c.attention_bias,
        scale=yarn_score_scale(c.yarn, (c.qk_nope_head_dim + c.qk_rope_head_dim) ** -0.5))
    return routed_layer(be, reader, prefix, index, attention, hidden=hidden,
                        dense_size=c.intermediate_size, routing=c.routing)


def build(config: DeepseekV3Config, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> LatentDecoderModel:
    c, be = config, backend
    reader = TensorReader(tensors, c.source)
    rope = yarn_rope(c.qk_rope_head_dim, c.rope_theta, c.yarn)
    trunk = routed_trunk(
        be, reader, c, lambda prefix, index, slot: decoder_layer(be, reader, prefix, c, index,
                                                                 slot, rope),
        model_type="deepseek_v3", num_kv_heads=1, head_dim=c.cache_width,
        max_context=max_context, latent=True)
    return LatentDecoderModel(trunk, be, max_context)


def stored_experts(be: Any, reader: TensorReader, c: DeepseekV3Config, index: int,
                   count: int) -> list[Any]:
    """Layer `index`'s first `count` routed experts as stored (a tensor-parallel rank's)."""
    return stored_sigmoid_experts(be, reader, f"model.layers.{index}.mlp.", c.hidden_size,
                                  c.routing, count)


FAMILY = Family(
    name="deepseek_v3",
    model_types=("deepseek_v3",),
    gguf_architectures=("deepseek2",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: tensors,
    gguf_tensors=gguf_tensors,
    build=build,
    tensor_parallel=lambda config: TensorParallelSplit(experts=stored_experts),
)
