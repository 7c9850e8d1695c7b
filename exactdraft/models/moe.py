"""Mixture-of-experts MLPs: per-token top-k routing, the routed experts' weighted sum, shared
experts.

Invariant: a row's output depends on that row alone, never on which other rows chose the same
experts or how many rows share the pass.
- Router logits come from the backend's row invariant linear; the scores are computed on the
  host per row in float64 with exactdraft.float64_math: softmax = exp(l - max l) divided by
  their tree_sum (qwen3_moe, mixtral, qwen3_next, qwen3_5_moe), or sigmoid(l) (nemotron_h).
- Top-k is a stable descending sort of the scores: equal scores go to the lower expert index.
  Group-limited routing (nemotron_h) first keeps the `top_groups` groups with the largest sum
  of their two best scores (plus the correction bias), ranked the same way, then takes the
  top-k of the kept experts by score plus bias.
- The weights are the chosen experts' scores (normalised by their tree_sum where the family
  says so, plus `norm_epsilon`; times `scale`), rounded to float32 once.
- Each chosen expert runs through the backend on the rows routed to it: a row's result does not
  depend on how many rows go with it. The host adds each row's expert outputs times their
  weights in increasing expert index, starting from zero; the shared expert (times sigmoid of
  its gate where the family has one) is added last.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft import float64_math
from exactdraft.backends.base import Backend
from exactdraft.errors import WeightError
from exactdraft.formats.table import stack_rows
from exactdraft.models.mixers import DenseMLP, PassContext
from exactdraft.models.recurrent import F32, sigmoid32, tree_sum
from exactdraft.models.tensors import TensorReader


@dataclass(frozen=True)
class RouterSettings:
    num_experts: int
    top_k: int
    scoring: str = "softmax"  # or "sigmoid"
    normalize: bool = True  # divide the chosen scores by their sum
    scale: float = 1.0  # routed_scaling_factor
    norm_epsilon: float = 0.0  # added to that sum
    groups: int = 1
    top_groups: int = 1


def top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest scores of each row, largest first, ties to the lower
    index."""
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


def route(settings: RouterSettings, logits: np.ndarray,
          correction_bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Chosen experts [M, k] (int64) and their weights [M, k] (float32) for router logits."""
    z = np.asarray(logits, dtype=np.float64)
    if settings.scoring == "softmax":
        exps = float64_math.exp(z - z.max(axis=-1, keepdims=True))
        scores = exps / tree_sum(exps, -1)[:, None]
    else:
        scores = float64_math.sigmoid(z)
    choice = scores if correction_bias is None else scores + correction_bias
    if settings.groups > 1:
        rows = choice.shape[0]
        grouped = choice.reshape(rows, settings.groups, -1)
        best_two = np.take_along_axis(grouped, top_indices(grouped, 2), axis=-1)
        kept = top_indices(best_two[..., 0] + best_two[..., 1], settings.top_groups)
        mask = np.zeros((rows, settings.groups), dtype=bool)
        np.put_along_axis(mask, kept, True, axis=-1)
        choice = np.where(np.repeat(mask, grouped.shape[-1], axis=-1), choice, -np.inf)
    experts = top_indices(choice, settings.top_k)
    weights = np.take_along_axis(scores, experts, axis=-1)
    if settings.normalize:
        weights = weights / (tree_sum(weights, -1)[:, None] + settings.norm_epsilon)
    return experts, (weights * settings.scale).astype(F32)


@dataclass
class MoEBlock:
    """`entry` is one matrix whose rows are the router's [E], then the shared expert's gate
    [1] and its gate and up rows [2S] where the family has them: every output element of a
    matmul has the bits it has alone, so one call stands in for three."""

    entry: Any
    settings: RouterSettings
    experts: list[DenseMLP]
    shared_down: Any = None  # the shared expert's down matrix [H, S], if it has one
    shared_gated: bool = False  # the shared expert is scaled by sigmoid of its gate row
    shared_activation: str = "silu"
    correction_bias: np.ndarray | None = None  # float64 [E], for the choice only
    latent_in: Any = None  # matrices [L, H] and [H, L] around the routed experts
    latent_out: Any = None

    def run(self, be: Backend, x: Any, ctx: PassContext | None = None) -> Any:
        experts = self.settings.num_experts
        entry = be.linear(x, self.entry)
        host = be.to_host(entry)
        chosen, weights = route(self.settings, host[:, :experts], self.correction_bias)
        inner = x if self.latent_in is None else be.linear(x, self.latent_in)
        rows_in = be.to_host(inner)
        total = np.zeros(rows_in.shape, dtype=F32)
        for rows, slots, out in self.expert_outputs(be, rows_in, chosen):
            total[rows] = total[rows] + out * weights[rows, slots][:, None]
        routed = be.vector(total)
        if self.latent_out is not None:
            routed = be.linear(routed, self.latent_out)
        if self.shared_down is None:
            return routed
        first = experts + self.shared_gated
        shared = DenseMLP(None, self.shared_down, self.shared_activation).finish(
            be, be.concatenate([entry[:, first:]]))
        if self.shared_gated:
            shared = be.vector(be.to_host(shared) * sigmoid32(host[:, experts:first]))
        return routed + shared

    def expert_outputs(self, be: Backend, rows_in: np.ndarray,
                       chosen: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, Any]]:
        """(rows, slots, output rows [len(rows), H] on the host) of every routed expert, in
        increasing expert index: the order `run` adds them in, whoever computes them."""
        for expert in np.unique(chosen):
            rows, slots = np.nonzero(chosen == expert)
            yield rows, slots, be.to_host(self.experts[int(expert)].run(
                be, be.vector(rows_in[rows])))


def make_moe_block(be: Backend, router: Any, settings: RouterSettings, experts: list[DenseMLP],
                   shared: tuple[Any, Any] | None = None, shared_gate: Any = None,
                   shared_activation: str = "silu", **options: Any) -> MoEBlock:
    """A MoEBlock from the router weight [E, H], the experts, the shared expert's (inner rows,
    down) weights and its gate weight [1, H] (raw tensors: they are stacked here)."""
    rows = [router, *([] if shared_gate is None else [shared_gate]),
            *([] if shared is None else [shared[0]])]
    return MoEBlock(entry=be.matrix(stack_rows(rows)), settings=settings, experts=experts,
                    shared_down=None if shared is None else be.matrix(shared[1]),
                    shared_gated=shared_gate is not None, shared_activation=shared_activation,
                    **options)


def load_experts(be: Backend, reader: TensorReader, prefix: str, count: int, hidden: int,
                 inner: int, names: tuple[str, ...], activation: str = "silu"
                 ) -> list[DenseMLP]:
    """The experts under `prefix`, stored one by one (`{prefix}{e}.{name}.weight` for names
    gate, up, down, or up, down when not gated) or fused (`{prefix}gate_up_proj` [E, 2I, H]
    or `{prefix}up_proj` [E, I, H], and `{prefix}down_proj` [E, H, I], as Qwen3.5-MoE and
    transformers' own layout have them)."""
    gated = len(names) == 3
    fused_in = f"{prefix}{'gate_up_proj' if gated else 'up_proj'}"
    if reader.has(fused_in):
        into = reader.array(fused_in, (count, (2 if gated else 1) * inner, hidden))
        down = reader.array(f"{prefix}down_proj", (count, hidden, inner))
        return [DenseMLP(be.matrix(into[e]), be.matrix(down[e]), activation)
                for e in range(count)]
    if not reader.has(f"{prefix}0.{names[0]}.weight"):
        raise WeightError(f"{reader.source}: checkpoint has no experts under {prefix!r} "
                          f"(neither {prefix}0.{names[0]}.weight nor {fused_in})")
    experts = []
    for e in range(count):
        *into, down = [f"{prefix}{e}.{name}.weight" for name in names]
        parts = [reader.get(name, (inner, hidden)) for name in into]
        experts.append(DenseMLP(be.matrix(stack_rows(parts) if gated else parts[0]),
                                be.matrix(reader.get(down, (hidden, inner))), activation))
    return experts
