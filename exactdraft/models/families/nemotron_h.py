"""The Mamba-2 hybrid family nemotron_h (Nemotron-H, Nemotron 3): config mapping, tensor names
and the model (a DecoderModel whose every layer is a token mixer or a feed-forward).

Invariant: a checkpoint reaches DecoderModel with the values it stores (under `backbone.` as
NVIDIA ships them, or `model.` as transformers writes them) and the family's choices made
explicit: each layer is h = h + mixer(rms_norm(h)) with the mixer named by `layers_block_type`
(or the `hybrid_override_pattern` letters M, *, -, E): Mamba-2 (mamba2.py), attention without
rope or q/k norms, a squared-ReLU MLP (up, relu(x)**2, down), or a mixture of squared-ReLU
experts routed by sigmoid scores with the correction bias, group-limited top-k, renormalised
where `norm_topk_prob` (plus 1e-20) and scaled by `routed_scaling_factor`, beside a shared
squared-ReLU expert (and latent projections around the routed experts where the config has
`moe_latent_size`). Norm weights are used as stored.

GGUF files: llama.cpp's `nemotron_h` and `nemotron_h_moe` architectures. A layer's kind is
read from the tensors it has (ssm_in, attn_q, ffn_gate_inp, ffn_up); A is stored as
-exp(A_log) (float32); q/k rows, which its converter permutes as for a llama rope (the model
has none), are put back. The time-step clamp is not in the file: transformers' defaults
(time_step_min 0.001, no upper limit) apply.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft import float64_math
from exactdraft.errors import ConfigError
from exactdraft.models.config import ConfigReader
from exactdraft.models.decoder import DecoderModel, HeadShape, Trunk
from exactdraft.models.families.registry import Family
from exactdraft.models.gguf_names import (
    GGUFRenamed,
    Part,
    gguf_head_dim,
    gguf_reader,
    gguf_special_tokens,
    rope_row_order,
    take_rows,
)
from exactdraft.models.layer import Layer
from exactdraft.models.mamba2 import Mamba2
from exactdraft.models.mixers import dense_mlp, dense_weights, load_attention, norm_vector
from exactdraft.models.moe import MoEBlock, RouterSettings, load_experts, make_moe_block
from exactdraft.models.split import TensorParallelSplit
from exactdraft.models.tensors import TensorReader

PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
KINDS = {"linear_attention": "mamba", "full_attention": "attention", "mamba": "mamba",
         "attention": "attention", "mlp": "mlp", "moe": "moe"}
RELU2 = ("up_proj", "down_proj")


@dataclass(frozen=True)
class NemotronHConfig:
    source: str
    vocab_size: int
    hidden_size: int
    layer_kinds: tuple[str, ...]  # mamba, attention, mlp or moe
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    intermediate_size: int
    mamba_heads: int
    mamba_head_dim: int
    mamba_groups: int
    state_size: int
    conv_kernel: int
    conv_bias: bool
    proj_bias: bool
    time_step_min: float
    time_step_max: float
    num_experts: int = 0
    top_k: int = 0
    expert_size: int = 0
    shared_expert_size: int = 0
    latent_size: int = 0
    normalize_top_k: bool = True
    routed_scale: float = 1.0
    groups: int = 1
    top_groups: int = 1


def config_from_hf(raw: Mapping[str, Any], source: str) -> NemotronHConfig:
    reader = ConfigReader(raw, source)
    kinds = reader.value("layers_block_type", None)
    if kinds is None:
        pattern = reader.value("hybrid_override_pattern")
        if not isinstance(pattern, str) or not set(pattern) <= set(PATTERN):
            raise reader.fail("hybrid_override_pattern", f"must be letters of "
                              f"{''.join(PATTERN)}, got {pattern!r}")
        kinds = [PATTERN[letter] for letter in pattern]
    if not isinstance(kinds, list) or not kinds or not set(kinds) <= set(KINDS):
        raise reader.fail("layers_block_type", f"must list layer kinds of {sorted(KINDS)}, got "
                          f"{kinds!r}")
    kinds = [KINDS[kind] for kind in kinds]
    for key, wanted in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        if reader.value(key, wanted) != wanted:
            raise reader.fail(key, f"is not supported; supported: {wanted}")
    heads = reader.int("num_attention_heads")
    hidden = reader.int("hidden_size")
    limit = reader.value("time_step_limit", None)
    upper = math.inf
    if isinstance(limit, list) and len(limit) == 2 and isinstance(limit[1], (int, float)):
        upper = float(limit[1])
    settings: dict[str, Any] = {}
    if "moe" in kinds:
        settings = dict(
            num_experts=reader.int("n_routed_experts"), top_k=reader.int("num_experts_per_tok"),
            expert_size=reader.int("moe_intermediate_size"),
            shared_expert_size=reader.int("moe_shared_expert_intermediate_size", 0, minimum=0),
            latent_size=reader.int("moe_latent_size", 0, minimum=0),
            normalize_top_k=reader.bool("norm_topk_prob", True),
            routed_scale=reader.float("routed_scaling_factor", 1.0),
            groups=reader.int("n_group", 1), top_groups=reader.int("topk_group", 1))
    return NemotronHConfig(
        source=source, vocab_size=reader.int("vocab_size"), hidden_size=hidden,
        layer_kinds=tuple(kinds), num_heads=heads,
        num_kv_heads=reader.int("num_key_value_heads", heads),
        head_dim=reader.int("head_dim", hidden // heads),
        eps=reader.float("layer_norm_epsilon", 1e-5),
        max_position_embeddings=reader.int("max_position_embeddings", 4096),
        tie_word_embeddings=reader.bool("tie_word_embeddings", False),
        eos_token_ids=reader.token_ids("eos_token_id"),
        intermediate_size=reader.int("intermediate_size", 1),
        mamba_heads=reader.int("mamba_num_heads"), mamba_head_dim=reader.int("mamba_head_dim"),
        mamba_groups=reader.int("n_groups", reader.int("mamba_n_groups", 1)),
        state_size=reader.int("ssm_state_size"),
        conv_kernel=reader.int("conv_kernel", reader.int("mamba_d_conv", 4)),
        conv_bias=reader.bool("use_conv_bias", True),
        proj_bias=reader.bool("use_bias", reader.bool("mamba_proj_bias", False)),
        time_step_min=reader.float("time_step_min", 0.001, positive=False),
        time_step_max=upper, **settings)


# The tensor that marks each kind of layer in a GGUF file.
GGUF_KINDS = {"ssm_in.weight": "mamba", "attn_q.weight": "attention",
              "ffn_gate_inp.weight": "moe", "ffn_up.weight": "mlp"}


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any],
                     source: str) -> NemotronHConfig:
    arch = fields["general.architecture"]
    reader = gguf_reader(fields, tensors, source, arch)
    hidden = reader.int("embedding_length")
    heads = reader.int("attention.head_count")
    kinds = []
    for i in range(reader.int("block_count")):
        kind = next((k for name, k in GGUF_KINDS.items() if f"blk.{i}.{name}" in tensors), None)
        if kind is None:
            raise ConfigError(f"{source}: GGUF layer {i} has none of "
                              f"{', '.join(f'blk.{i}.{name}' for name in GGUF_KINDS)}")
        kinds.append(kind)
    kv_heads = reader.value("attention.head_count_kv", heads)
    kv_heads = sorted({n for n in kv_heads if n}) if isinstance(kv_heads, list) else [kv_heads]
    if len(kv_heads) != 1:
        raise reader.fail("attention.head_count_kv", f"must give one head count for the "
                          f"attention layers, got {kv_heads}")
    mamba_heads = reader.int("ssm.time_step_rank")
    inner = reader.int("ssm.inner_size")
    if inner % mamba_heads:
        raise reader.fail("ssm.inner_size", f"({inner}) is not a multiple of the "
                          f"{mamba_heads} heads")
    first = {kind: kinds.index(kind) for kind in kinds}  # the first layer of each kind
    settings: dict[str, Any] = {}
    if "moe" in kinds:
        settings = dict(
            num_experts=reader.int("expert_count"), top_k=reader.int("expert_used_count"),
            expert_size=reader.int("expert_feed_forward_length"),
            shared_expert_size=reader.int("expert_shared_feed_forward_length", 0, minimum=0),
            latent_size=reader.int("moe_latent_size", 0, minimum=0),
            normalize_top_k=reader.bool("expert_weights_norm", True),
            routed_scale=reader.float("expert_weights_scale", 1.0),
            groups=reader.int("expert_group_count", 1),
            top_groups=reader.int("expert_group_used_count", 1))
    return NemotronHConfig(
        source=source, vocab_size=int(tensors.shape("token_embd.weight")[0]),
        hidden_size=hidden, layer_kinds=tuple(kinds), num_heads=heads,
        num_kv_heads=kv_heads[0], head_dim=gguf_head_dim(reader, hidden, heads),
        eps=reader.float("attention.layer_norm_rms_epsilon",
                         reader.float("attention.layer_norm_epsilon", 1e-5)),
        max_position_embeddings=reader.int("context_length", 4096),
        tie_word_embeddings="output.weight" not in tensors,
        eos_token_ids=gguf_special_tokens(fields, source)["eos_token_ids"],
        intermediate_size=tensors.shape(f"blk.{first['mlp']}.ffn_up.weight")[0]
        if "mlp" in first else 1,
        mamba_heads=mamba_heads, mamba_head_dim=inner // mamba_heads,
        mamba_groups=reader.int("ssm.group_count", 1), state_size=reader.int("ssm.state_size"),
        conv_kernel=reader.int("ssm.conv_kernel"),
        conv_bias=f"blk.{first.get('mamba', 0)}.ssm_conv1d.bias" in tensors,
        proj_bias=f"blk.{first.get('mamba', 0)}.ssm_in.bias" in tensors,
        time_step_min=0.001, time_step_max=math.inf, **settings)


def gguf_tensors(config: NemotronHConfig, tensors: Mapping[str, Any],
                 source: str) -> GGUFRenamed:
    c = config
    parts = {
        "attn_norm.weight": Part("norm.weight"),
        **{f"ssm_{gguf}.{kind}": Part(f"mixer.{hf}_proj.{kind}")
           for gguf, hf in (("in", "in"), ("out", "out")) for kind in ("weight", "bias")},
        "ssm_conv1d.weight": Part("mixer.conv1d.weight", shape=lambda s: (s[0], 1, s[1])),
        "ssm_conv1d.bias": Part("mixer.conv1d.bias"),
        "ssm_dt.bias": Part("mixer.dt_bias"),
        "ssm_a": Part("mixer.A", shape=lambda s: (s[0],)),
        "ssm_d": Part("mixer.D", shape=lambda s: (s[0],)),
        "ssm_norm.weight": Part("mixer.norm.weight", shape=lambda s: (s[0] * s[1],)),
        **{f"attn_{gguf}.weight": Part(f"mixer.{hf}_proj.weight")
           for gguf, hf in (("v", "v"), ("output", "o"))},
        "ffn_up.weight": Part("mixer.up_proj.weight"),
        "ffn_down.weight": Part("mixer.down_proj.weight"),
        "ffn_gate_inp.weight": Part("mixer.gate.weight"),
        "exp_probs_b.bias": Part("mixer.gate.e_score_correction_bias"),
        "ffn_up_exps.weight": Part("mixer.experts.{e}.up_proj.weight"),
        "ffn_down_exps.weight": Part("mixer.experts.{e}.down_proj.weight"),
        "ffn_up_shexp.weight": Part("mixer.shared_experts.up_proj.weight"),
        "ffn_down_shexp.weight": Part("mixer.shared_experts.down_proj.weight"),
        "ffn_latent_down.weight": Part("mixer.fc1_latent_proj.weight"),
        "ffn_latent_up.weight": Part("mixer.fc2_latent_proj.weight"),
    }
    for name, heads in (("q", c.num_heads), ("k", c.num_kv_heads)):
        order = rope_row_order(heads, c.head_dim)  # the converter permuted them
        parts[f"attn_{name}.weight"] = Part(f"mixer.{name}_proj.weight", convert=lambda value,
                                            order=order: take_rows(value, order))
    names = {"token_embd.weight": "backbone.embeddings.weight",
             "output_norm.weight": "backbone.norm_f.weight", "output.weight": "lm_head.weight"}
    return GGUFRenamed(tensors, source, names, parts, lambda i: f"backbone.layers.{i}.")


def mamba(be: Any, reader: TensorReader, prefix: str, c: NemotronHConfig, slot: int) -> Mamba2:
    hidden, heads = c.hidden_size, c.mamba_heads
    inner = heads * c.mamba_head_dim
    channels = inner + 2 * c.mamba_groups * c.state_size
    projected = inner + channels + heads
    conv = reader.array(prefix + "conv1d.weight", (channels, 1, c.conv_kernel))
    # GGUF files store A = -exp(A_log) (float32) instead of A_log.
    a = reader.array(prefix + "A", (heads,)).astype(np.float64) if reader.has(prefix + "A") \
        else -float64_math.exp(reader.array(prefix + "A_log", (heads,)))

    def bias(name: str, size: int) -> Any:
        return be.vector(reader.array(prefix + name, (size,))) if c.proj_bias else None

    return Mamba2(
        in_proj=be.matrix(reader.get(prefix + "in_proj.weight", (projected, hidden))),
        out_proj=be.matrix(reader.get(prefix + "out_proj.weight", (hidden, inner))),
        conv_weight=np.ascontiguousarray(conv[:, 0, :].T),
        conv_bias=reader.array(prefix + "conv1d.bias", (channels,)) if c.conv_bias else None,
        a=a,
        dt_bias=reader.array(prefix + "dt_bias", (heads,)).astype(np.float64),
        skip=reader.array(prefix + "D", (heads,)),
        norm_weight=reader.array(prefix + "norm.weight", (inner,)),
        num_heads=heads, head_dim=c.mamba_head_dim, groups=c.mamba_groups,
        state_size=c.state_size, time_step_min=c.time_step_min, time_step_max=c.time_step_max,
        eps=c.eps, slot=slot, in_bias=bias("in_proj.bias", projected),
        out_bias=bias("out_proj.bias", hidden))


def moe(be: Any, reader: TensorReader, prefix: str, c: NemotronHConfig) -> MoEBlock:
    hidden, width = c.hidden_size, c.latent_size or c.hidden_size
    latent_in = latent_out = None
    if c.latent_size:
        latent_in = be.matrix(reader.get(prefix + "fc1_latent_proj.weight", (width, hidden)))
        latent_out = be.matrix(reader.get(prefix + "fc2_latent_proj.weight", (hidden, width)))
    bias = prefix + "gate.e_score_correction_bias"
    shared = dense_weights(reader, prefix + "shared_experts.", hidden, c.shared_expert_size,
                           RELU2) if c.shared_expert_size else None
    return make_moe_block(
        be, reader.get(prefix + "gate.weight", (c.num_experts, hidden)),
        RouterSettings(c.num_experts, c.top_k, scoring="sigmoid", normalize=c.normalize_top_k,
                       scale=c.routed_scale, norm_epsilon=1e-20, groups=c.groups,
                       top_groups=c.top_groups),
        load_experts(be, reader, prefix + "experts.", c.num_experts, width, c.expert_size,
                     RELU2, activation="relu2"),
        shared, shared_activation="relu2",
        correction_bias=reader.array(bias, (c.num_experts,)).astype(np.float64)
        if reader.has(bias) else None,
        latent_in=latent_in, latent_out=latent_out)


def layers_root(reader: TensorReader) -> str:
    """Where the layers live: `backbone.` (the Hugging Face files) or `model.`."""
    return "backbone." if reader.has("backbone.embeddings.weight") else "model."


def build(config: NemotronHConfig, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> DecoderModel:
    c, be = config, backend
    reader = TensorReader(tensors, c.source)
    root = layers_root(reader)
    hidden = c.hidden_size
    layers: list[Layer] = []
    kv_slot = slot = 0
    for i, kind in enumerate(c.layer_kinds):
        prefix = f"{root}layers.{i}.mixer."
        if kind == "mamba":
            part: Any = mamba(be, reader, prefix, c, slot)
            slot += 1
        elif kind == "attention":
            part = load_attention(be, reader, prefix, hidden=hidden, heads=c.num_heads,
                                  kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                                  kv_slot=kv_slot, eps=c.eps, rope=None)
            kv_slot += 1
        elif kind == "mlp":
            part = dense_mlp(be, reader, prefix, hidden, c.intermediate_size, RELU2, "relu2")
        else:
            part = moe(be, reader, prefix, c)
        norm = norm_vector(be, reader, f"{root}layers.{i}.norm.weight", hidden)
        # A layer is one residual block: a token mixer or a feed-forward (checkpoints call
        # either one `mixer`).
        layers.append(Layer(norm, part) if kind in ("mamba", "attention") else
                      Layer(feed_forward_norm=norm, feed_forward=part))
    embedding = reader.array(root + "embeddings.weight", (c.vocab_size, hidden))
    head = root + "embeddings.weight" if c.tie_word_embeddings else "lm_head.weight"
    output = reader.get(head, (c.vocab_size, hidden))
    trunk = Trunk(
        model_type="nemotron_h", source=c.source, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, eos_token_ids=c.eos_token_ids,
        eps=c.eps, hidden_size=hidden, embedding=embedding,
        final_norm=norm_vector(be, reader, root + "norm_f.weight", hidden),
        lm_head=be.matrix(output), layers=layers,
        kv_layers=kv_slot, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
        digest=reader.digest, output_table=lambda: output, config=c,
        # Its attention layers have no rotary embedding; a head's own takes the usual base.
        head_shape=HeadShape(str(c.source), hidden, c.num_heads, c.num_kv_heads, c.head_dim,
                             c.intermediate_size or c.expert_size, c.eps, 10000.0))
    return DecoderModel(trunk, be, max_context)


TENSOR_PARALLEL = TensorParallelSplit(
    experts=lambda be, reader, c, index, count: load_experts(
        be, reader, f"{layers_root(reader)}layers.{index}.mixer.experts.", count,
        c.latent_size or c.hidden_size, c.expert_size, RELU2, activation="relu2"),
    attention=lambda reader, index: f"{layers_root(reader)}layers.{index}.mixer.",
    recurrent=lambda be, reader, c, index, mixer: mamba(
        be, reader, f"{layers_root(reader)}layers.{index}.mixer.", c, mixer.slot))


FAMILY = Family(
    name="nemotron_h",
    model_types=("nemotron_h",),
    gguf_architectures=("nemotron_h", "nemotron_h_moe"),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: tensors,
    gguf_tensors=gguf_tensors,
    build=build,
    tensor_parallel=lambda config: TENSOR_PARALLEL,
)
