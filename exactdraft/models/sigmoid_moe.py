"""The mixture of experts of DeepSeek-V3 and GLM-4.5 (the same routing and tensor names):
sigmoid router scores, the correction bias `e_score_correction_bias` added for the choice only,
group-limited top-k (the `topk_group` of `n_group` groups with the largest sum of their two
best biased scores), the chosen scores renormalised where `norm_topk_prob` (plus 1e-20) and
scaled by `routed_scaling_factor`, beside `n_shared_experts` shared experts (one silu-gated MLP
of n_shared_experts * moe_intermediate_size); the first `first_k_dense_replace` layers have a
dense MLP instead.

Invariant: the routing is moe.py's route (host float64, stable ties to the lower index) and the
block is moe.py's MoEBlock, so a row's output depends on that row alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.models.config import ConfigReader
from exactdraft.models.mixers import dense_weights
from exactdraft.models.moe import MoEBlock, RouterSettings, load_experts, make_moe_block
from exactdraft.models.tensors import TensorReader


@dataclass(frozen=True)
class SigmoidRouting:
    num_experts: int
    top_k: int
    expert_size: int
    shared_experts: int
    normalize: bool
    scale: float
    groups: int
    top_groups: int
    first_dense: int  # first_k_dense_replace

    def settings(self) -> RouterSettings:
        return RouterSettings(self.num_experts, self.top_k, scoring="sigmoid",
                              normalize=self.normalize, scale=self.scale, norm_epsilon=1e-20,
                              groups=self.groups, top_groups=self.top_groups)


def sigmoid_routing_from_hf(reader: ConfigReader) -> SigmoidRouting:
    """The routing of config.json; DeepSeek's own keys `scoring_func` and `topk_method`, where
    a file has them, must name this routing (sigmoid, noaux_tc)."""
    for key, wanted in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if reader.value(key, wanted) != wanted:
            raise reader.fail(key, f"is not supported; supported: {wanted}")
    experts = reader.int("n_routed_experts")
    top_k = reader.int("num_experts_per_tok")
    groups = reader.int("n_group", 1)
    top_groups = reader.int("topk_group", 1)
    if top_k > experts:
        raise reader.fail("num_experts_per_tok", f"({top_k}) exceeds the {experts} experts")
    if experts % groups:
        raise reader.fail("n_group", f"({groups}) does not divide the {experts} experts")
    if top_groups > groups:
        raise reader.fail("topk_group", f"({top_groups}) exceeds the {groups} groups")
    if groups > 1 and experts // groups < 2:
        raise reader.fail("n_group", f"({groups}) leaves fewer than two experts a group")
    return SigmoidRouting(
        num_experts=experts, top_k=top_k, expert_size=reader.int("moe_intermediate_size"),
        shared_experts=reader.int("n_shared_experts", 0, minimum=0),
        normalize=reader.bool("norm_topk_prob", True),
        scale=reader.float("routed_scaling_factor", 1.0), groups=groups,
        top_groups=top_groups, first_dense=reader.int("first_k_dense_replace", 0, minimum=0))


def sigmoid_routing_from_gguf(reader: ConfigReader, gating: int, normalize: bool
                              ) -> SigmoidRouting:
    """llama.cpp's expert_* metadata (a reader of the architecture's keys); `gating` and
    `normalize` stand for expert_gating_func and expert_weights_norm where the file has
    none (its converters write them per family). Only sigmoid gating (2) is read."""
    if reader.int("expert_gating_func", gating) != 2:
        raise reader.fail("expert_gating_func", "is not sigmoid (2); softmax-routed files are "
                          "not supported")
    experts = reader.int("expert_count")
    routing = SigmoidRouting(
        num_experts=experts, top_k=reader.int("expert_used_count"),
        expert_size=reader.int("expert_feed_forward_length"),
        shared_experts=reader.int("expert_shared_count", 0, minimum=0),
        normalize=reader.bool("expert_weights_norm", normalize),
        scale=reader.float("expert_weights_scale", 1.0),
        groups=reader.int("expert_group_count", 1),
        top_groups=reader.int("expert_group_used_count", 1),
        first_dense=reader.int("leading_dense_block_count", 0, minimum=0))
    r = routing
    if r.top_k > experts or experts % r.groups or r.top_groups > r.groups:
        raise reader.fail("expert_used_count", f"({r.top_k}), expert_group_count ({r.groups}) "
                          f"or expert_group_used_count ({r.top_groups}) does not fit the "
                          f"{experts} experts")
    return routing


GATED = ("gate_proj", "up_proj", "down_proj")


def load_sigmoid_moe(be: Any, reader: TensorReader, prefix: str, hidden: int,
                     routing: SigmoidRouting) -> MoEBlock:
    """The block under `prefix` (`mlp.`): gate.weight, gate.e_score_correction_bias, experts,
    shared_experts."""
    r = routing
    bias = prefix + "gate.e_score_correction_bias"
    shared = dense_weights(reader, prefix + "shared_experts.", hidden,
                           r.shared_experts * r.expert_size) if r.shared_experts else None
    return make_moe_block(
        be, reader.get(prefix + "gate.weight", (r.num_experts, hidden)), r.settings(),
        load_experts(be, reader, prefix + "experts.", r.num_experts, hidden, r.expert_size,
                     GATED),
        shared=shared,
        correction_bias=reader.array(bias, (r.num_experts,)).astype(np.float64)
        if reader.has(bias) else None)


def stored_sigmoid_experts(be: Any, reader: TensorReader, prefix: str, hidden: int,
                           routing: SigmoidRouting, count: int) -> list[Any]:
    """The first `count` routed experts under `prefix` as stored (a tensor-parallel rank's
    loader)."""
    return load_experts(be, reader, prefix + "experts.", count, hidden, routing.expert_size,
                        GATED)

