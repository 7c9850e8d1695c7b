"""The Mamba-2 hybrid family nemotron_h (Nemotron-H, Nemotron 3): config mapping, tensor names
and the model (a HybridModel with one mixer per layer).

Invariant: a checkpoint reaches HybridModel with the values it stores (under `backbone.` as
NVIDIA ships them, or `model.` as transformers writes them) and the family's choices made
explicit: each layer is h = h + mixer(rms_norm(h)) with the mixer named by `layers_block_type`
(or the `hybrid_override_pattern` letters M, *, -, E): Mamba-2 (mamba2.py), attention without
rope or q/k norms, a squared-ReLU MLP (up, relu(x)**2, down), or a mixture of squared-ReLU
experts routed by sigmoid scores with the correction bias, group-limited top-k, renormalised
where `norm_topk_prob` (plus 1e-20) and scaled by `routed_scaling_factor`, beside a shared
squared-ReLU expert (and latent projections around the routed experts where the config has
`moe_latent_size`). Norm weights are used as stored.
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
from exactdraft.models.hybrid import Block, HybridModel, Trunk
from exactdraft.models.mamba2 import Mamba2
from exactdraft.models.mixers import (
    TensorReader,
    dense_mlp,
    dense_weights,
    load_attention,
    norm_vector,
)
from exactdraft.models.moe import MoEBlock, RouterSettings, load_experts, make_moe_block
from exactdraft.models.registry import Family

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


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any], source: str) -> Any:
    raise ConfigError(f"{source}: Nemotron-H GGUF files are not supported yet")


def mamba(be: Any, reader: TensorReader, prefix: str, c: NemotronHConfig, slot: int) -> Mamba2:
    hidden, heads = c.hidden_size, c.mamba_heads
    inner = heads * c.mamba_head_dim
    channels = inner + 2 * c.mamba_groups * c.state_size
    projected = inner + channels + heads
    conv = reader.array(prefix + "conv1d.weight", (channels, 1, c.conv_kernel))

    def bias(name: str, size: int) -> Any:
        return be.vector(reader.array(prefix + name, (size,))) if c.proj_bias else None

    return Mamba2(
        in_proj=be.matrix(reader.get(prefix + "in_proj.weight", (projected, hidden))),
        out_proj=be.matrix(reader.get(prefix + "out_proj.weight", (hidden, inner))),
        conv_weight=np.ascontiguousarray(conv[:, 0, :].T),
        conv_bias=reader.array(prefix + "conv1d.bias", (channels,)) if c.conv_bias else None,
        a=-float64_math.exp(reader.array(prefix + "A_log", (heads,))),
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


def build(config: NemotronHConfig, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> HybridModel:
    c, be = config, backend
    reader = TensorReader(tensors, c.source)
    root = "backbone." if reader.has("backbone.embeddings.weight") else "model."
    hidden = c.hidden_size
    blocks: list[Block] = []
    kv_slot = slot = 0
    for i, kind in enumerate(c.layer_kinds):
        prefix = f"{root}layers.{i}.mixer."
        if kind == "mamba":
            mixer: Any = mamba(be, reader, prefix, c, slot)
            slot += 1
        elif kind == "attention":
            mixer = load_attention(be, reader, prefix, hidden=hidden, heads=c.num_heads,
                                   kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                                   kv_slot=kv_slot, eps=c.eps, rope=None)
            kv_slot += 1
        elif kind == "mlp":
            mixer = dense_mlp(be, reader, prefix, hidden, c.intermediate_size, RELU2, "relu2")
        else:
            mixer = moe(be, reader, prefix, c)
        blocks.append(Block(norm_vector(be, reader, f"{root}layers.{i}.norm.weight", hidden),
                            mixer))
    embedding = reader.array(root + "embeddings.weight", (c.vocab_size, hidden))
    head = root + "embeddings.weight" if c.tie_word_embeddings else "lm_head.weight"
    trunk = Trunk(
        model_type="nemotron_h", source=c.source, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, eos_token_ids=c.eos_token_ids,
        eps=c.eps, embedding=embedding,
        final_norm=norm_vector(be, reader, root + "norm_f.weight", hidden),
        lm_head=be.matrix(reader.get(head, (c.vocab_size, hidden))), blocks=blocks,
        kv_layers=kv_slot, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
        digest=reader.digest)
    return HybridModel(trunk, be, max_context)


FAMILY = Family(
    name="nemotron_h",
    model_types=("nemotron_h",),
    gguf_architectures=(),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: tensors,
    gguf_tensors=lambda config, tensors, source: tensors,
    build=build,
)
