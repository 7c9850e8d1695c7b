"""gpt-oss's mixture of experts: a router with a bias, and experts whose SwiGLU is clamped and
whose projections have biases.

Invariant: a row's output depends on that row alone (models/moe.py's argument). The router's
logits and each expert's projections come from the backend's row invariant linear (with their
biases); the top-k is models/moe.py's `route` over the softmax of all logits, renormalised over
the chosen experts, which is the softmax of the chosen logits; the clamped gate is elementwise
float32 on the host with float64_math's sigmoid rounded once:
gate = min(gate, limit), up = clip(up, -limit, limit), out = (up + 1) * gate * sigmoid(alpha
gate). Rows add their experts' weighted outputs in increasing expert index from zero.

Hugging Face stores the experts fused and transposed (`gate_up_proj` [E, H, 2I] with gate and
up interleaved by column, `down_proj` [E, I, H]); they are put in the backend's [N, K] layout
with the gate rows first, then the up rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend
from exactdraft.errors import WeightError
from exactdraft.models.mixers import PassContext
from exactdraft.models.moe import MoEBlock, route
from exactdraft.models.recurrent import F32, sigmoid32
from exactdraft.models.tensors import TensorReader


@dataclass
class ClampedSwiGLUExpert:
    gate_up: Any  # matrix [2I, H]: gate rows, then up rows
    gate_up_bias: Any  # vector [2I]
    down: Any  # matrix [H, I]
    down_bias: Any  # vector [H]
    alpha: float
    limit: float

    def run(self, be: Backend, x: Any, ctx: PassContext | None = None) -> Any:
        inner = be.to_host(be.linear(x, self.gate_up, self.gate_up_bias))
        size = inner.shape[1] // 2
        gate = np.minimum(inner[:, :size], F32(self.limit))
        up = np.clip(inner[:, size:], F32(-self.limit), F32(self.limit))
        gated = (up + F32(1.0)) * (gate * sigmoid32(gate * F32(self.alpha)))
        return be.linear(be.vector(gated), self.down, self.down_bias)


@dataclass
class BiasedRouterMoE(MoEBlock):
    """A MoEBlock whose router (`entry` [E, H]) adds a bias [E]; no shared expert."""

    entry_bias: Any = None

    def run(self, be: Backend, x: Any, ctx: PassContext | None = None) -> Any:
        logits = be.to_host(be.linear(x, self.entry, self.entry_bias))
        chosen, weights = route(self.settings, logits)
        rows_in = be.to_host(x)
        total = np.zeros(rows_in.shape, dtype=F32)
        for rows, slots, out in self.expert_outputs(be, rows_in, chosen):
            total[rows] = total[rows] + out * weights[rows, slots][:, None]
        return be.vector(total)


def load_clamped_experts(be: Backend, reader: TensorReader, prefix: str, count: int,
                         hidden: int, inner: int, alpha: float, limit: float
                         ) -> list[ClampedSwiGLUExpert]:
    """The experts under `prefix` (Hugging Face's fused, transposed layout)."""
    if reader.has(f"{prefix}gate_up_proj_blocks"):
        raise WeightError(f"{reader.source}: the experts under {prefix!r} are stored as MXFP4 "
                          "blocks, which this loader does not read; use a bfloat16 or float32 "
                          "copy of the checkpoint")
    gate_up = reader.array(f"{prefix}gate_up_proj", (count, hidden, 2 * inner))
    gate_up_bias = reader.array(f"{prefix}gate_up_proj_bias", (count, 2 * inner))
    down = reader.array(f"{prefix}down_proj", (count, inner, hidden))
    down_bias = reader.array(f"{prefix}down_proj_bias", (count, hidden))
    experts = []
    for e in range(count):
        rows = gate_up[e].T  # [2I, H], gate and up interleaved
        bias = gate_up_bias[e]
        experts.append(ClampedSwiGLUExpert(
            gate_up=be.matrix(np.ascontiguousarray(np.concatenate([rows[0::2], rows[1::2]]))),
            gate_up_bias=be.vector(np.concatenate([bias[0::2], bias[1::2]])),
            down=be.matrix(np.ascontiguousarray(down[e].T)), down_bias=be.vector(down_bias[e]),
            alpha=alpha, limit=limit))
    return experts
