"""The mixture-of-experts attention families qwen3_moe and mixtral: config mapping, tensor names
and the model (a DecoderModel of attention and MoE or dense MLP layers).

Invariant: a checkpoint reaches DecoderModel with the values it stores under Hugging Face's names
(experts one by one, `mlp.experts.{e}.gate_proj` / `block_sparse_moe.experts.{e}.w1` and so on,
or fused `experts.gate_up_proj` [E, 2I, H]), and with each family's routing made explicit:
qwen3_moe takes the top-k of the softmax over all experts, renormalised only when
`norm_topk_prob` is true, with dense MLP layers where `mlp_only_layers` or
`decoder_sparse_step` say; mixtral takes the top-k of the softmax and always renormalises.
Attention is llama's (qk norms for qwen3_moe, sliding windows where configured).

GGUF files: llama.cpp's `qwen3moe` architecture, and Mixtral as it writes it (architecture
`llama` with `llama.expert_count`, q/k rows permuted for its interleaved rope and put back
here); experts come stacked (`ffn_gate_exps` [E, I, H], ...) and are sliced one per expert.
llama.cpp always renormalises the top-k weights of both (unless `expert_weights_norm` says
otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exactdraft.models.blocks import RopeTable, rope_frequencies
from exactdraft.models.config import (
    ConfigReader,
    RopeScaling,
    rope_scaling_from_hf,
    rope_theta_from_hf,
    sliding_windows_from_hf,
)
from exactdraft.models.decoder import DecoderModel, HeadShape, Trunk
from exactdraft.models.families.registry import Family
from exactdraft.models.gguf_names import (
    GGUF_ATTENTION,
    GGUF_MLP,
    GGUFRenamed,
    Part,
    gguf_head_dim,
    gguf_reader,
    gguf_rope_scaling,
    gguf_special_tokens,
    rope_row_order,
    take_rows,
)
from exactdraft.models.layer import Layer
from exactdraft.models.mixers import dense_mlp, load_attention, norm_vector
from exactdraft.models.moe import RouterSettings, load_experts, make_moe_block
from exactdraft.models.split import TensorParallelSplit
from exactdraft.models.tensors import TensorReader


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


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any],
                     source: str) -> MoEConfig:
    """llama.cpp's qwen3moe metadata, or a llama file with experts (Mixtral)."""
    arch = fields["general.architecture"]
    reader = gguf_reader(fields, tensors, source, arch)
    mixtral = arch == "llama"
    hidden = reader.int("embedding_length")
    heads = reader.int("attention.head_count")
    layers = reader.int("block_count")
    head_dim = gguf_head_dim(reader, hidden, heads)
    if reader.int("rope.dimension_count", head_dim) != head_dim:
        raise reader.fail("rope.dimension_count", "is a partial rotary embedding, which is not "
                          "supported")
    experts = reader.int("expert_count")
    top_k = reader.int("expert_used_count")
    if top_k > experts:
        raise reader.fail("expert_used_count", f"({top_k}) exceeds the {experts} experts")
    expert_size = reader.int("feed_forward_length" if mixtral else "expert_feed_forward_length")
    return MoEConfig(
        model_type="mixtral" if mixtral else "qwen3_moe", source=source,
        vocab_size=int(tensors.shape("token_embd.weight")[0]), hidden_size=hidden,
        num_layers=layers, num_heads=heads,
        num_kv_heads=reader.int("attention.head_count_kv", heads), head_dim=head_dim,
        rms_norm_eps=reader.float("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=reader.float("rope.freq_base", 10000.0),
        rope_scaling=gguf_rope_scaling(reader),
        max_position_embeddings=reader.int("context_length", 2048),
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias="blk.0.attn_q.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        sliding_windows=(reader.int("attention.sliding_window", 0, minimum=0),) * layers,
        eos_token_ids=gguf_special_tokens(fields, source)["eos_token_ids"],
        num_experts=experts, top_k=top_k,
        normalize_top_k=reader.bool("expert_weights_norm", True),
        expert_size=expert_size,
        dense_size=reader.int("feed_forward_length", expert_size),
        sparse_layers=tuple(f"blk.{i}.ffn_gate_inp.weight" in tensors for i in range(layers)))


GGUF_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
              "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def gguf_tensors(config: MoEConfig, tensors: Mapping[str, Any], source: str) -> GGUFRenamed:
    parts = {**GGUF_ATTENTION, **GGUF_MLP,
             "ffn_norm.weight": Part("post_attention_layernorm.weight")}
    if config.model_type == "mixtral":  # llama.cpp's converter permuted these rows
        for name, heads in (("q", config.num_heads), ("k", config.num_kv_heads)):
            order = rope_row_order(heads, config.head_dim)
            for kind in ("weight", "bias"):
                parts[f"attn_{name}.{kind}"] = Part(
                    parts[f"attn_{name}.{kind}"].name,
                    convert=lambda value, order=order: take_rows(value, order))
    return GGUFRenamed(tensors, source, GGUF_NAMES, parts, lambda i: f"model.layers.{i}.")


def build(config: MoEConfig, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> DecoderModel:
    c, be = config, backend
    reader = TensorReader(tensors, c.source)
    hidden = c.hidden_size
    rope = RopeTable(rope_frequencies(c.head_dim, c.rope_theta, c.rope_scaling))
    settings = RouterSettings(c.num_experts, c.top_k, normalize=c.normalize_top_k)
    layers = []
    for i in range(c.num_layers):
        layer = f"model.layers.{i}."
        attention = load_attention(
            be, reader, layer + "self_attn.", hidden=hidden, heads=c.num_heads,
            kv_heads=c.num_kv_heads, head_dim=c.head_dim, kv_slot=i, eps=c.rms_norm_eps,
            rope=rope, qk_norm=c.qk_norm, bias=c.attention_bias, window=c.sliding_windows[i])
        attention_norm = norm_vector(be, reader, layer + "input_layernorm.weight", hidden)
        if not c.sparse_layers[i]:
            mlp: Any = dense_mlp(be, reader, layer + "mlp.", hidden, c.dense_size)
        else:
            moe, names = experts_location(reader, c, i)
            mlp = make_moe_block(
                be, reader.get(moe + "gate.weight", (c.num_experts, hidden)), settings,
                load_experts(be, reader, moe + "experts.", c.num_experts, hidden,
                             c.expert_size, names))
        layers.append(Layer(attention_norm, attention, norm_vector(
            be, reader, layer + "post_attention_layernorm.weight", hidden), mlp))
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
                             c.dense_size or c.expert_size, c.rms_norm_eps, c.rope_theta))
    return DecoderModel(trunk, be, max_context)


def experts_location(reader: TensorReader, c: MoEConfig, index: int
                     ) -> tuple[str, tuple[str, str, str]]:
    """Where layer `index`'s router and experts live, and its experts' three matrix names
    (Mixtral's Hugging Face files keep them under block_sparse_moe, as w1, w3, w2)."""
    layer = f"model.layers.{index}."
    if c.model_type == "mixtral" and reader.has(layer + "block_sparse_moe.gate.weight"):
        return layer + "block_sparse_moe.", ("w1", "w3", "w2")
    return layer + "mlp.", ("gate_proj", "up_proj", "down_proj")


def stored_experts(be: Any, reader: TensorReader, c: MoEConfig, index: int,
                   count: int) -> list[Any]:
    moe, names = experts_location(reader, c, index)
    return load_experts(be, reader, moe + "experts.", count, c.hidden_size, c.expert_size, names)


FAMILY = Family(
    name="qwen3_moe",
    model_types=("qwen3_moe", "mixtral"),
    gguf_architectures=("qwen3moe",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: tensors,
    gguf_tensors=gguf_tensors,
    build=build,
    tensor_parallel=lambda config: TensorParallelSplit(experts=stored_experts),
)
