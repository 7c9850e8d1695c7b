"""The Gated DeltaNet hybrid families: qwen3_next, qwen3_5 and qwen3_5_moe (flat `*_text`
configs, or nested under `text_config` with the vision part ignored): config mapping, tensor
names and the model (a HybridModel), with the checkpoint's MTP layers as an MTPHead.

Invariant: a checkpoint reaches HybridModel with the values it stores and the families' choices
made explicit: RMS norm weights used as float32(1 + w) (except the linear attention's gated
norm, used as w); full attention with q/k norms, rope on the first
`partial_rotary_factor * head_dim` dimensions (mrope sections coincide for text) and an output
gate (q_proj holds, per head, D query rows then D gate rows); Gated DeltaNet layers where
`layer_types` (or every `full_attention_interval`-th layer otherwise) says linear_attention,
Qwen3-Next's grouped in_proj_qkvz / in_proj_ba rows put into Qwen3.5's order (q, k, v, z, b, a);
MoE MLPs with softmax top-k routing (renormalised where `norm_topk_prob`; always for
qwen3_5_moe) and a shared expert scaled by sigmoid of its gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft import float64_math
from exactdraft.errors import ConfigError
from exactdraft.models.blocks import RopeTable, rope_frequencies
from exactdraft.models.config import ConfigReader, rope_theta_from_hf
from exactdraft.models.gated_deltanet import GatedDeltaNet
from exactdraft.models.hybrid import Block, HybridModel, Trunk
from exactdraft.models.mixers import (
    TensorReader,
    dense_mlp,
    dense_weights,
    load_attention,
    norm_vector,
    rotary_frequencies,
)
from exactdraft.models.moe import RouterSettings, load_experts, make_moe_block
from exactdraft.models.mtp_head import MTPHead
from exactdraft.models.registry import Family

NESTED = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}
TEXT_PREFIXES = ("model.language_model.", "model.")  # nested checkpoints first


@dataclass(frozen=True)
class HybridQwenConfig:
    model_type: str  # the text model's: qwen3_next, qwen3_5_text or qwen3_5_moe_text
    source: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    linear_layers: tuple[bool, ...]  # per layer: Gated DeltaNet (True) or full attention
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    intermediate_size: int
    conv_kernel: int
    linear_key_heads: int
    linear_value_heads: int
    linear_key_dim: int
    linear_value_dim: int
    sparse_layers: tuple[bool, ...]  # per layer: MoE (True) or dense MLP
    num_experts: int = 0
    top_k: int = 0
    normalize_top_k: bool = True
    expert_size: int = 0
    shared_expert_size: int = 0
    mtp_layers: int = 0


def config_from_hf(raw: Mapping[str, Any], source: str) -> HybridQwenConfig:
    if raw.get("model_type") in NESTED:
        text = raw.get("text_config")
        if not isinstance(text, Mapping):
            raise ConfigError(f"{source}: a {raw['model_type']} config needs a text_config object")
        outer = {k: raw[k] for k in ("tie_word_embeddings", "eos_token_id") if k in raw}
        raw = {**outer, **text, "model_type": NESTED[raw["model_type"]]}
    reader = ConfigReader(raw, source)
    model_type = reader.value("model_type")
    if reader.value("hidden_act", "silu") not in ("silu", "swish"):
        raise reader.fail("hidden_act", "is not supported; supported: silu")
    hidden = reader.int("hidden_size")
    heads = reader.int("num_attention_heads")
    layers = reader.int("num_hidden_layers")
    kinds = reader.value("layer_types", None)
    if kinds is None:
        interval = reader.int("full_attention_interval", 4)
        kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or \
            not set(kinds) <= {"linear_attention", "full_attention"}:
        raise reader.fail("layer_types", f"must list linear_attention or full_attention for "
                          f"each of the {layers} layers, got {kinds!r}")
    head_dim = reader.int("head_dim", hidden // heads)
    rope = reader.value("rope_parameters", {}) or {}
    if not isinstance(rope, Mapping):
        raise reader.fail("rope_parameters", f"must be an object, got {rope!r}")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ("default", "mrope", None):
        raise reader.fail("rope_parameters", f"has rope_type {kind!r}; supported: default")
    factor = rope.get("partial_rotary_factor", reader.value("partial_rotary_factor", 0.25))
    rotary = int(head_dim * factor)
    if not (isinstance(factor, (int, float)) and 0 < rotary <= head_dim and rotary % 2 == 0):
        raise reader.fail("partial_rotary_factor", f"{factor!r} does not give an even rotary "
                          f"size within head_dim {head_dim}")
    moe = model_type != "qwen3_5_text"
    sparse = (False,) * layers
    settings: dict[str, Any] = {}
    if moe:
        step = reader.int("decoder_sparse_step", 1)
        dense_only = reader.value("mlp_only_layers", []) or []
        sparse = tuple(i not in dense_only and (i + 1) % step == 0 for i in range(layers))
        settings = dict(
            num_experts=reader.int("num_experts"), top_k=reader.int("num_experts_per_tok"),
            normalize_top_k=model_type == "qwen3_5_moe_text" or reader.bool("norm_topk_prob",
                                                                             True),
            expert_size=reader.int("moe_intermediate_size"),
            shared_expert_size=reader.int("shared_expert_intermediate_size", 0, minimum=0))
    mtp_key = "num_nextn_predict_layers" if model_type == "qwen3_next" else \
        "mtp_num_hidden_layers"
    return HybridQwenConfig(
        model_type=model_type, source=source, vocab_size=reader.int("vocab_size"),
        hidden_size=hidden, num_layers=layers,
        linear_layers=tuple(k == "linear_attention" for k in kinds), num_heads=heads,
        num_kv_heads=reader.int("num_key_value_heads", heads), head_dim=head_dim,
        rotary_dim=rotary, rope_theta=rope_theta_from_hf(reader),
        rms_norm_eps=reader.float("rms_norm_eps", 1e-6),
        max_position_embeddings=reader.int("max_position_embeddings", 2048),
        tie_word_embeddings=reader.bool("tie_word_embeddings", False),
        eos_token_ids=reader.token_ids("eos_token_id"),
        intermediate_size=reader.int("intermediate_size", 1),
        conv_kernel=reader.int("linear_conv_kernel_dim", 4),
        linear_key_heads=reader.int("linear_num_key_heads"),
        linear_value_heads=reader.int("linear_num_value_heads"),
        linear_key_dim=reader.int("linear_key_head_dim"),
        linear_value_dim=reader.int("linear_value_head_dim"),
        sparse_layers=sparse, mtp_layers=reader.int(mtp_key, 0, minimum=0), **settings)


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any], source: str) -> Any:
    raise ConfigError(f"{source}: Gated DeltaNet GGUF files are not supported yet")


def deltanet(be: Any, reader: TensorReader, prefix: str, c: HybridQwenConfig,
             slot: int) -> GatedDeltaNet:
    hidden, hk, hv = c.hidden_size, c.linear_key_heads, c.linear_value_heads
    dk, dv = c.linear_key_dim, c.linear_value_dim
    channels = 2 * hk * dk + hv * dv
    if reader.has(prefix + "in_proj_qkvz.weight"):  # Qwen3-Next: rows grouped by key head
        group = hv // hk
        qkvz = reader.array(prefix + "in_proj_qkvz.weight", (channels + hv * dv, hidden))
        qkvz = qkvz.reshape(hk, 2 * dk + 2 * group * dv, hidden)
        split = np.cumsum([dk, dk, group * dv])
        q, k, v, z = (part.reshape(-1, hidden) for part in np.split(qkvz, split, axis=1))
        ba = reader.array(prefix + "in_proj_ba.weight", (2 * hv, hidden)).reshape(hk, 2 * group,
                                                                                 hidden)
        b, a = ba[:, :group].reshape(hv, hidden), ba[:, group:].reshape(hv, hidden)
        rows = [q, k, v, z, b, a]
    else:  # Qwen3.5
        rows = [reader.array(prefix + "in_proj_qkv.weight", (channels, hidden)),
                reader.array(prefix + "in_proj_z.weight", (hv * dv, hidden)),
                reader.array(prefix + "in_proj_b.weight", (hv, hidden)),
                reader.array(prefix + "in_proj_a.weight", (hv, hidden))]
    conv = reader.array(prefix + "conv1d.weight", (channels, 1, c.conv_kernel))
    return GatedDeltaNet(
        in_proj=be.matrix(np.concatenate(rows)),
        out_proj=be.matrix(reader.get(prefix + "out_proj.weight", (hidden, hv * dv))),
        conv_weight=np.ascontiguousarray(conv[:, 0, :].T),
        decay_rate=float64_math.exp(reader.array(prefix + "A_log", (hv,))),
        dt_bias=reader.array(prefix + "dt_bias", (hv,)).astype(np.float64),
        norm_weight=reader.array(prefix + "norm.weight", (dv,)),
        num_key_heads=hk, num_value_heads=hv, key_dim=dk, value_dim=dv, eps=c.rms_norm_eps,
        slot=slot)


def mlp(be: Any, reader: TensorReader, prefix: str, c: HybridQwenConfig, sparse: bool) -> Any:
    hidden = c.hidden_size
    if not sparse:
        return dense_mlp(be, reader, prefix, hidden, c.intermediate_size)
    shared = gate = None
    if c.shared_expert_size:
        shared = dense_weights(reader, prefix + "shared_expert.", hidden, c.shared_expert_size)
        gate = reader.get(prefix + "shared_expert_gate.weight", (1, hidden))
    return make_moe_block(
        be, reader.get(prefix + "gate.weight", (c.num_experts, hidden)),
        RouterSettings(c.num_experts, c.top_k, normalize=c.normalize_top_k),
        load_experts(be, reader, prefix + "experts.", c.num_experts, hidden, c.expert_size,
                     ("gate_proj", "up_proj", "down_proj")), shared, gate)


def layer_blocks(be: Any, reader: TensorReader, prefix: str, c: HybridQwenConfig, *,
                 linear: bool, sparse: bool, kv_slot: int, slot: int,
                 rope: RopeTable) -> list[Block]:
    hidden, eps = c.hidden_size, c.rms_norm_eps
    if linear:
        mixer: Any = deltanet(be, reader, prefix + "linear_attn.", c, slot)
    else:
        mixer = load_attention(be, reader, prefix + "self_attn.", hidden=hidden,
                               heads=c.num_heads, kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                               kv_slot=kv_slot, eps=eps, rope=rope, rotary_dim=c.rotary_dim,
                               qk_norm=True, norm_shift=1.0, gated=True)
    return [Block(norm_vector(be, reader, prefix + "input_layernorm.weight", hidden, 1.0), mixer),
            Block(norm_vector(be, reader, prefix + "post_attention_layernorm.weight", hidden,
                              1.0), mlp(be, reader, prefix + "mlp.", c, sparse))]


def build(config: HybridQwenConfig, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> HybridModel:
    c, be = config, backend
    reader = TensorReader(tensors, c.source)
    text = next((p for p in TEXT_PREFIXES if reader.has(p + "embed_tokens.weight")),
                TEXT_PREFIXES[-1])
    hidden = c.hidden_size
    inv_freq = rope_frequencies(c.rotary_dim, c.rope_theta, None)
    rope = RopeTable(rotary_frequencies(c.head_dim, c.rotary_dim, inv_freq))
    blocks: list[Block] = []
    kv_slot = slot = 0
    for i in range(c.num_layers):
        linear = c.linear_layers[i]
        blocks += layer_blocks(be, reader, f"{text}layers.{i}.", c, linear=linear,
                               sparse=c.sparse_layers[i], kv_slot=kv_slot, slot=slot, rope=rope)
        kv_slot, slot = kv_slot + (not linear), slot + linear
    embedding = reader.array(text + "embed_tokens.weight", (c.vocab_size, hidden))
    head = text + "embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    lm_head = be.matrix(reader.get(head, (c.vocab_size, hidden)))
    limit = min(max_context or c.max_position_embeddings, c.max_position_embeddings)
    trunk = Trunk(
        model_type=c.model_type, source=c.source, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, eos_token_ids=c.eos_token_ids,
        eps=c.rms_norm_eps, embedding=embedding,
        final_norm=norm_vector(be, reader, text + "norm.weight", hidden, 1.0),
        lm_head=lm_head, blocks=blocks, kv_layers=kv_slot, num_kv_heads=c.num_kv_heads,
        head_dim=c.head_dim, digest=reader.digest,
        mtp=mtp_head(be, TensorReader(tensors, c.source), c, embedding, lm_head, rope, limit))
    return HybridModel(trunk, be, max_context)


def mtp_head(be: Any, reader: TensorReader, c: HybridQwenConfig, embedding: np.ndarray,
             lm_head: Any, rope: RopeTable, max_context: int) -> MTPHead | None:
    """The checkpoint's `mtp.*` layers, or None if it ships none."""
    if not reader.has("mtp.fc.weight"):
        return None
    count = c.mtp_layers
    while not count and reader.has(f"mtp.layers.{count}.input_layernorm.weight"):
        count += 1
    hidden = c.hidden_size
    layers = [layer_blocks(be, reader, f"mtp.layers.{j}.", c, linear=False,
                           sparse=c.num_experts > 0, kv_slot=j, slot=0, rope=rope)
              for j in range(count)]
    return MTPHead(
        backend=be, fc=be.matrix(reader.get("mtp.fc.weight", (hidden, 2 * hidden))),
        embedding_norm=norm_vector(be, reader, "mtp.pre_fc_norm_embedding.weight", hidden, 1.0),
        hidden_norm=norm_vector(be, reader, "mtp.pre_fc_norm_hidden.weight", hidden, 1.0),
        final_norm=norm_vector(be, reader, "mtp.norm.weight", hidden, 1.0), layers=layers,
        embedding=embedding, lm_head=lm_head, eps=c.rms_norm_eps, vocab_size=c.vocab_size,
        num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, max_context=max_context)


FAMILY = Family(
    name="qwen3_next",
    model_types=("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
    gguf_architectures=(),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: tensors,
    gguf_tensors=lambda config, tensors, source: tensors,
    build=build,
)
