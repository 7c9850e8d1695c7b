"""The Gated DeltaNet hybrid families: qwen3_next, qwen3_5 and qwen3_5_moe (flat `*_text`
configs, or nested under `text_config` with the vision part ignored): config mapping, tensor
names and the model (a DecoderModel), with the checkpoint's MTP layers as an MTPHead.

Invariant: a checkpoint reaches DecoderModel with the values it stores and the families' choices
made explicit: RMS norm weights used as float32(1 + w) (except the linear attention's gated
norm, used as w); full attention with q/k norms, rope on the first
`partial_rotary_factor * head_dim` dimensions (mrope sections coincide for text) and an output
gate (q_proj holds, per head, D query rows then D gate rows); Gated DeltaNet layers where
`layer_types` (or every `full_attention_interval`-th layer otherwise) says linear_attention,
Qwen3-Next's grouped in_proj_qkvz / in_proj_ba rows put into Qwen3.5's order (q, k, v, z, b, a);
MoE MLPs with softmax top-k routing (renormalised where `norm_topk_prob`; always for
qwen3_5_moe) and a shared expert scaled by sigmoid of its gate.

GGUF files: llama.cpp's `qwen3next`, `qwen35` and `qwen35moe` architectures. Its converter
stores norms as 1 + w (used as they are), A as -exp(A_log) (float32), Qwen3-Next's q, k, v, z
rows already in Qwen3.5's order and, for Qwen3.5 with fewer key than value heads, the value
heads tiled (v0 of every key head, then v1, ...) rather than grouped: they are put back in
Hugging Face's grouped order here. Linear-attention layers are those `full_attention_interval`
does not mark; the `nextn_predict_layers` blocks after the trunk are the MTP head.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft import float64_math
from exactdraft.errors import ConfigError
from exactdraft.models.blocks import RopeTable, rope_frequencies
from exactdraft.models.config import ConfigReader, rope_theta_from_hf
from exactdraft.models.decoder import DecoderModel, HeadShape, Trunk
from exactdraft.models.families.registry import Family
from exactdraft.models.gated_deltanet import GatedDeltaNet
from exactdraft.models.gguf_names import (
    GGUF_ATTENTION,
    GGUF_MLP,
    GGUFRenamed,
    Part,
    gguf_head_dim,
    gguf_reader,
    gguf_special_tokens,
)
from exactdraft.models.layer import Layer
from exactdraft.models.mixers import (
    dense_mlp,
    dense_weights,
    load_attention,
    norm_vector,
    rotary_frequencies,
)
from exactdraft.models.moe import RouterSettings, load_experts, make_moe_block
from exactdraft.models.mtp_head import MTPHead
from exactdraft.models.recurrent import F32
from exactdraft.models.split import TensorParallelSplit
from exactdraft.models.tensors import TensorReader

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
    norm_shift: float = 1.0  # added to the RMS norm weights (0: the file stores 1 + w)


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


GGUF_ARCHITECTURES = {"qwen3next": "qwen3_next", "qwen35": "qwen3_5_text",
                      "qwen35moe": "qwen3_5_moe_text"}


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any],
                     source: str) -> HybridQwenConfig:
    arch = fields["general.architecture"]
    reader = gguf_reader(fields, tensors, source, arch)
    hidden = reader.int("embedding_length")
    heads = reader.int("attention.head_count")
    head_dim = gguf_head_dim(reader, hidden, heads)
    mtp = reader.int("nextn_predict_layers", 0, minimum=0)
    layers = reader.int("block_count", minimum=mtp + 1) - mtp
    interval = reader.int("full_attention_interval", 4)
    rotary = reader.int("rope.dimension_count", head_dim // 4)
    if rotary > head_dim or rotary % 2:
        raise reader.fail("rope.dimension_count", f"({rotary}) must be even and at most the "
                          f"head size {head_dim}")
    value_heads = reader.int("ssm.time_step_rank")
    inner = reader.int("ssm.inner_size")
    if inner % value_heads:
        raise reader.fail("ssm.inner_size", f"({inner}) is not a multiple of the "
                          f"{value_heads} value heads")
    settings: dict[str, Any] = {}
    if arch != "qwen35":
        settings = dict(
            num_experts=reader.int("expert_count"), top_k=reader.int("expert_used_count"),
            normalize_top_k=reader.bool("expert_weights_norm", True),
            expert_size=reader.int("expert_feed_forward_length"),
            shared_expert_size=reader.int("expert_shared_feed_forward_length", 0, minimum=0))
    return HybridQwenConfig(
        model_type=GGUF_ARCHITECTURES[arch], source=source,
        vocab_size=int(tensors.shape("token_embd.weight")[0]), hidden_size=hidden,
        num_layers=layers, linear_layers=tuple((i + 1) % interval != 0 for i in range(layers)),
        num_heads=heads, num_kv_heads=reader.int("attention.head_count_kv", heads),
        head_dim=head_dim, rotary_dim=rotary, rope_theta=reader.float("rope.freq_base", 1e7),
        rms_norm_eps=reader.float("attention.layer_norm_rms_epsilon", 1e-6),
        max_position_embeddings=reader.int("context_length", 2048),
        tie_word_embeddings="output.weight" not in tensors,
        eos_token_ids=gguf_special_tokens(fields, source)["eos_token_ids"],
        intermediate_size=reader.int("feed_forward_length", 1),
        conv_kernel=reader.int("ssm.conv_kernel"),
        linear_key_heads=reader.int("ssm.group_count"), linear_value_heads=value_heads,
        linear_key_dim=reader.int("ssm.state_size"), linear_value_dim=inner // value_heads,
        sparse_layers=tuple(f"blk.{i}.ffn_gate_inp.weight" in tensors for i in range(layers)),
        mtp_layers=mtp, norm_shift=0.0, **settings)


def grouped_value_heads(value: Any, c: HybridQwenConfig, size: int, axis: int = 0,
                        first: int = 0) -> np.ndarray:
    """Undo llama.cpp's tiled value-head order along `axis` from index `first` on: blocks of
    `size` stored (value j of every key head, for j = 0, 1, ...) -> (key head, value j)."""
    array = np.moveaxis(np.asarray(value, dtype=F32), axis, 0)
    per_key = c.linear_value_heads // c.linear_key_heads
    heads = array[first:]
    heads = heads.reshape(per_key, c.linear_key_heads, size, *heads.shape[1:]).swapaxes(0, 1)
    array = np.concatenate([array[:first], heads.reshape(-1, *array.shape[1:])])
    return np.ascontiguousarray(np.moveaxis(array, 0, axis))


def gguf_tensors(config: HybridQwenConfig, tensors: Mapping[str, Any],
                 source: str) -> GGUFRenamed:
    c = config
    linear = "linear_attn."
    parts = {
        **GGUF_ATTENTION, **GGUF_MLP,
        "post_attention_norm.weight": Part("post_attention_layernorm.weight"),
        "attn_qkv.weight": Part(linear + "in_proj_qkv.weight"),
        "attn_gate.weight": Part(linear + "in_proj_z.weight"),
        "ssm_ba.weight": Part(linear + "in_proj_ba.weight"),
        "ssm_beta.weight": Part(linear + "in_proj_b.weight"),
        "ssm_alpha.weight": Part(linear + "in_proj_a.weight"),
        "ssm_a": Part(linear + "A"),
        "ssm_dt.bias": Part(linear + "dt_bias"),
        "ssm_conv1d.weight": Part(linear + "conv1d.weight", shape=lambda s: (s[0], 1, s[1])),
        "ssm_norm.weight": Part(linear + "norm.weight"),
        "ssm_out.weight": Part(linear + "out_proj.weight"),
        **{f"ffn_{kind}_shexp.weight": Part(f"mlp.shared_expert.{kind}_proj.weight")
           for kind in ("gate", "up", "down")},
        "ffn_gate_inp_shexp.weight": Part("mlp.shared_expert_gate.weight",
                                          shape=lambda s: (1, s[-1])),
    }
    if c.model_type != "qwen3_next" and c.linear_key_heads != c.linear_value_heads:
        qk = 2 * c.linear_key_heads * c.linear_key_dim
        dv = c.linear_value_dim
        for name, size, axis, first in (
                ("attn_qkv.weight", dv, 0, qk), ("attn_gate.weight", dv, 0, 0),
                ("ssm_beta.weight", 1, 0, 0), ("ssm_alpha.weight", 1, 0, 0),
                ("ssm_a", 1, 0, 0), ("ssm_dt.bias", 1, 0, 0), ("ssm_conv1d.weight", dv, 0, qk),
                ("ssm_out.weight", dv, 1, 0)):
            parts[name] = Part(parts[name].name, parts[name].shape, functools.partial(
                grouped_value_heads, c=c, size=size, axis=axis, first=first))
    trunk = c.num_layers
    names = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
    for block in range(trunk, trunk + c.mtp_layers):  # each MTP block repeats the head's own
        for gguf, hf in (("eh_proj", "fc"), ("enorm", "pre_fc_norm_embedding"),
                         ("hnorm", "pre_fc_norm_hidden"), ("shared_head_norm", "norm")):
            names[f"blk.{block}.nextn.{gguf}.weight"] = f"mtp.{hf}.weight"
    return GGUFRenamed(tensors, source, names, parts,
                       lambda i: f"model.layers.{i}." if i < trunk else f"mtp.layers.{i - trunk}.")


def deltanet(be: Any, reader: TensorReader, prefix: str, c: HybridQwenConfig,
             slot: int) -> GatedDeltaNet:
    hidden, hk, hv = c.hidden_size, c.linear_key_heads, c.linear_value_heads
    dk, dv = c.linear_key_dim, c.linear_value_dim
    channels = 2 * hk * dk + hv * dv
    group = hv // hk
    if reader.has(prefix + "in_proj_qkvz.weight"):  # Qwen3-Next: rows grouped by key head
        qkvz = reader.array(prefix + "in_proj_qkvz.weight", (channels + hv * dv, hidden))
        qkvz = qkvz.reshape(hk, 2 * dk + 2 * group * dv, hidden)
        split = np.cumsum([dk, dk, group * dv])
        q, k, v, z = (part.reshape(-1, hidden) for part in np.split(qkvz, split, axis=1))
        rows = [q, k, v, z]
    else:  # Qwen3.5 (and Qwen3-Next's GGUF files)
        rows = [reader.array(prefix + "in_proj_qkv.weight", (channels, hidden)),
                reader.array(prefix + "in_proj_z.weight", (hv * dv, hidden))]
    if reader.has(prefix + "in_proj_ba.weight"):  # Qwen3-Next: b, a grouped by key head
        ba = reader.array(prefix + "in_proj_ba.weight", (2 * hv, hidden)).reshape(hk, 2 * group,
                                                                                 hidden)
        rows += [ba[:, :group].reshape(hv, hidden), ba[:, group:].reshape(hv, hidden)]
    else:
        rows += [reader.array(prefix + "in_proj_b.weight", (hv, hidden)),
                 reader.array(prefix + "in_proj_a.weight", (hv, hidden))]
    conv = reader.array(prefix + "conv1d.weight", (channels, 1, c.conv_kernel))
    # GGUF files store A = -exp(A_log) (float32) instead of A_log.
    decay_rate = -reader.array(prefix + "A", (hv,)).astype(np.float64) \
        if reader.has(prefix + "A") else float64_math.exp(reader.array(prefix + "A_log", (hv,)))
    return GatedDeltaNet(
        in_proj=be.matrix(np.concatenate(rows)),
        out_proj=be.matrix(reader.get(prefix + "out_proj.weight", (hidden, hv * dv))),
        conv_weight=np.ascontiguousarray(conv[:, 0, :].T),
        decay_rate=decay_rate,
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


def decoder_layer(be: Any, reader: TensorReader, prefix: str, c: HybridQwenConfig, *,
                  linear: bool, sparse: bool, kv_slot: int, slot: int,
                  rope: RopeTable) -> Layer:
    hidden, eps = c.hidden_size, c.rms_norm_eps
    if linear:
        mixer: Any = deltanet(be, reader, prefix + "linear_attn.", c, slot)
    else:
        mixer = load_attention(be, reader, prefix + "self_attn.", hidden=hidden,
                               heads=c.num_heads, kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                               kv_slot=kv_slot, eps=eps, rope=rope, rotary_dim=c.rotary_dim,
                               qk_norm=True, norm_shift=c.norm_shift, gated=True)
    shift = c.norm_shift
    mixer_norm = norm_vector(be, reader, prefix + "input_layernorm.weight", hidden, shift)
    return Layer(mixer_norm, mixer,
                 norm_vector(be, reader, prefix + "post_attention_layernorm.weight", hidden,
                             shift), mlp(be, reader, prefix + "mlp.", c, sparse))


def text_prefix(reader: TensorReader) -> str:
    """Where the language model's tensors live: nested (multimodal checkpoints) or not."""
    return next((p for p in TEXT_PREFIXES if reader.has(p + "embed_tokens.weight")),
                TEXT_PREFIXES[-1])


def build(config: HybridQwenConfig, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> DecoderModel:
    c, be = config, backend
    reader = TensorReader(tensors, c.source)
    text = text_prefix(reader)
    hidden = c.hidden_size
    inv_freq = rope_frequencies(c.rotary_dim, c.rope_theta, None)
    rope = RopeTable(rotary_frequencies(c.head_dim, c.rotary_dim, inv_freq))
    layers: list[Layer] = []
    kv_slot = slot = 0
    for i in range(c.num_layers):
        linear = c.linear_layers[i]
        layers.append(decoder_layer(be, reader, f"{text}layers.{i}.", c, linear=linear,
                                    sparse=c.sparse_layers[i], kv_slot=kv_slot, slot=slot,
                                    rope=rope))
        kv_slot, slot = kv_slot + (not linear), slot + linear
    embedding = reader.array(text + "embed_tokens.weight", (c.vocab_size, hidden))
    head = text + "embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    output = reader.get(head, (c.vocab_size, hidden))
    lm_head = be.matrix(output)
    limit = min(max_context or c.max_position_embeddings, c.max_position_embeddings)
    trunk = Trunk(
        model_type=c.model_type, source=c.source, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, eos_token_ids=c.eos_token_ids,
        eps=c.rms_norm_eps, hidden_size=hidden, embedding=embedding,
        final_norm=norm_vector(be, reader, text + "norm.weight", hidden, c.norm_shift),
        lm_head=lm_head, layers=layers, kv_layers=kv_slot, num_kv_heads=c.num_kv_heads,
        head_dim=c.head_dim, digest=reader.digest, output_table=lambda: output, config=c,
        head_shape=HeadShape(str(c.source), hidden, c.num_heads, c.num_kv_heads, c.head_dim,
                             c.intermediate_size or c.expert_size, c.rms_norm_eps,
                             c.rope_theta),
        mtp=mtp_head(be, TensorReader(tensors, c.source), c, embedding, lm_head, rope, limit))
    return DecoderModel(trunk, be, max_context)


def mtp_head(be: Any, reader: TensorReader, c: HybridQwenConfig, embedding: np.ndarray,
             lm_head: Any, rope: RopeTable, max_context: int) -> MTPHead | None:
    """The checkpoint's `mtp.*` layers, or None if it ships none."""
    if not reader.has("mtp.fc.weight"):
        return None
    count = c.mtp_layers
    while not count and reader.has(f"mtp.layers.{count}.input_layernorm.weight"):
        count += 1
    hidden, shift = c.hidden_size, c.norm_shift
    layers = [decoder_layer(be, reader, f"mtp.layers.{j}.", c, linear=False,
                            sparse=c.num_experts > 0, kv_slot=j, slot=0, rope=rope)
              for j in range(count)]
    return MTPHead(
        backend=be, fc=be.matrix(reader.get("mtp.fc.weight", (hidden, 2 * hidden))),
        embedding_norm=norm_vector(be, reader, "mtp.pre_fc_norm_embedding.weight", hidden,
                                   shift),
        hidden_norm=norm_vector(be, reader, "mtp.pre_fc_norm_hidden.weight", hidden, shift),
        final_norm=norm_vector(be, reader, "mtp.norm.weight", hidden, shift), layers=layers,
        embedding=embedding, lm_head=lm_head, eps=c.rms_norm_eps, vocab_size=c.vocab_size,
        num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, max_context=max_context)


TENSOR_PARALLEL = TensorParallelSplit(
    experts=lambda be, reader, c, index, count: load_experts(
        be, reader, f"{text_prefix(reader)}layers.{index}.mlp.experts.", count, c.hidden_size,
        c.expert_size, ("gate_proj", "up_proj", "down_proj")),
    attention=lambda reader, index: f"{text_prefix(reader)}layers.{index}.self_attn.",
    recurrent=lambda be, reader, c, index, mixer: deltanet(
        be, reader, f"{text_prefix(reader)}layers.{index}.linear_attn.", c, mixer.slot))


FAMILY = Family(
    name="qwen3_next",
    model_types=("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"),
    gguf_architectures=tuple(GGUF_ARCHITECTURES),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: tensors,
    gguf_tensors=gguf_tensors,
    build=build,
    tensor_parallel=lambda config: TENSOR_PARALLEL,
)
