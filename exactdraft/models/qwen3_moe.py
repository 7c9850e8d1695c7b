"""The mixture-of-experts attention families qwen3_moe and mixtral: config mapping, tensor names
and the model (a HybridModel of attention and MoE blocks).

Invariant: a checkpoint reaches HybridModel with the values it stores under Hugging Face's names
(experts one by one, `mlp.experts.{e}.gate_proj` / `block_sparse_moe.experts.{e}.w1` and so on,
or fused `experts.gate_up_proj` [E, 2I, H]), and with each family's routing made explicit:
qwen3_moe takes the top-k of the softmax over all experts, renormalised only when
`norm_topk_prob` is true, with dense MLP layers where `mlp_only_layers` or
`decoder_sparse_step` say; mixtral takes the top-k of the softmax and always renormalises.
Attention is llama's (qk norms for qwen3_moe, sliding windows where configured).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exactdraft.errors import ConfigError
from exactdraft.models.blocks import RopeTable, rope_frequencies
from exactdraft.models.config import (
    ConfigReader,
    RopeScaling,
    rope_scaling_from_hf,
    rope_theta_from_hf,
)
from exactdraft.models.hybrid import Block, HybridModel, Trunk
from exactdraft.models.llama import sliding_windows_from_hf
from exactdraft.models.mixers import TensorReader, dense_mlp, load_attention, norm_vector
from exactdraft.models.moe import RouterSettings, load_experts, make_moe_block
from exactdraft.models.registry import Family


@dataclass(frozen=True)
class MoEConfig:
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
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    sliding_windows: tuple[int, ...]
    eos_token_ids: tuple[int, ...]
    num_experts: int
    top_k: int
    normalize_top_k: bool
    expert_size: int
    dense_size: int  # of the dense MLP layers
    sparse_layers: tuple[bool, ...]  # per layer: MoE (True) or dense MLP


def config_from_hf(raw: Mapping[str, Any], source: str) -> MoEConfig:
    reader = ConfigReader(raw, source)
    model_type = reader.value("model_type")
    if reader.value("hidden_act", "silu") not in ("silu", "swish"):
        raise reader.fail("hidden_act", "is not supported; supported: silu")
    hidden = reader.int("hidden_size")
    heads = reader.int("num_attention_heads")
    layers = reader.int("num_hidden_layers")
    mixtral = model_type == "mixtral"
    # Qwen's config.json says num_experts; transformers 5 writes num_local_experts for both.
    experts = reader.int("num_experts") if reader.has("num_experts") else \
        reader.int("num_local_experts")
    top_k = reader.int("num_experts_per_tok")
    if top_k > experts:
        raise reader.fail("num_experts_per_tok", f"({top_k}) exceeds the {experts} experts")
    if mixtral:
        sparse = (True,) * layers
        expert_size = dense_size = reader.int("intermediate_size")
    else:
        step = reader.int("decoder_sparse_step", 1)
        dense_only = reader.value("mlp_only_layers", []) or []
        sparse = tuple(i not in dense_only and (i + 1) % step == 0 for i in range(layers))
        expert_size = reader.int("moe_intermediate_size")
        dense_size = reader.int("intermediate_size", expert_size)
    return MoEConfig(
        model_type=model_type, source=source, vocab_size=reader.int("vocab_size"),
        hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=reader.int("num_key_value_heads", heads),
        head_dim=reader.int("head_dim", hidden // heads),
        rms_norm_eps=reader.float("rms_norm_eps", 1e-6),
        rope_theta=rope_theta_from_hf(reader), rope_scaling=rope_scaling_from_hf(reader),
        max_position_embeddings=reader.int("max_position_embeddings", 2048),
        tie_word_embeddings=reader.bool("tie_word_embeddings", False),
        attention_bias=reader.bool("attention_bias", False), qk_norm=not mixtral,
        sliding_windows=sliding_windows_from_hf(reader, layers),
        eos_token_ids=reader.token_ids("eos_token_id"),
        num_experts=experts, top_k=top_k,
        normalize_top_k=True if mixtral else reader.bool("norm_topk_prob", False),
        expert_size=expert_size, dense_size=dense_size, sparse_layers=sparse)


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any], source: str) -> Any:
    raise ConfigError(f"{source}: mixture-of-experts GGUF files are not supported yet")


def build(config: MoEConfig, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> HybridModel:
    c, be = config, backend
    reader = TensorReader(tensors, c.source)
    hidden = c.hidden_size
    rope = RopeTable(rope_frequencies(c.head_dim, c.rope_theta, c.rope_scaling))
    settings = RouterSettings(c.num_experts, c.top_k, normalize=c.normalize_top_k)
    mixtral = c.model_type == "mixtral"
    blocks = []
    for i in range(c.num_layers):
        layer = f"model.layers.{i}."
        attention = load_attention(
            be, reader, layer + "self_attn.", hidden=hidden, heads=c.num_heads,
            kv_heads=c.num_kv_heads, head_dim=c.head_dim, kv_slot=i, eps=c.rms_norm_eps,
            rope=rope, qk_norm=c.qk_norm, bias=c.attention_bias, window=c.sliding_windows[i])
        blocks.append(Block(norm_vector(be, reader, layer + "input_layernorm.weight", hidden),
                            attention))
        if not c.sparse_layers[i]:
            mlp: Any = dense_mlp(be, reader, layer + "mlp.", hidden, c.dense_size)
        else:
            moe = layer + ("block_sparse_moe." if mixtral and
                           reader.has(layer + "block_sparse_moe.gate.weight") else "mlp.")
            names = ("w1", "w3", "w2") if moe.endswith("block_sparse_moe.") else \
                ("gate_proj", "up_proj", "down_proj")
            mlp = make_moe_block(
                be, reader.get(moe + "gate.weight", (c.num_experts, hidden)), settings,
                load_experts(be, reader, moe + "experts.", c.num_experts, hidden,
                             c.expert_size, names))
        blocks.append(Block(norm_vector(be, reader, layer + "post_attention_layernorm.weight",
                                        hidden), mlp))
    embedding = reader.array("model.embed_tokens.weight", (c.vocab_size, hidden))
    head = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    trunk = Trunk(
        model_type=c.model_type, source=c.source, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, eos_token_ids=c.eos_token_ids,
        eps=c.rms_norm_eps, embedding=embedding,
        final_norm=norm_vector(be, reader, "model.norm.weight", hidden),
        lm_head=be.matrix(reader.get(head, (c.vocab_size, hidden))), blocks=blocks,
        kv_layers=c.num_layers, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
        digest=reader.digest)
    return HybridModel(trunk, be, max_context)


FAMILY = Family(
    name="qwen3_moe",
    model_types=("qwen3_moe", "mixtral"),
    gguf_architectures=(),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: tensors,
    gguf_tensors=lambda config, tensors, source: tensors,
    build=build,
)
