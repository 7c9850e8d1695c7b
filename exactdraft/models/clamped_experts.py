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
with the gate rows first, then the up rows. OpenAI's checkpoints store them as MXFP4 blocks in
[N, K] layout, which become GGUF mxfp4 blocks (`mxfp4_rows`) holding the same values exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend
from exactdraft.errors import WeightError
from exactdraft.formats.table import QuantizedTensor, stack_rows
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


def mxfp4_rows(blocks: np.ndarray, scales: np.ndarray) -> QuantizedTensor:
    """A matrix [N, 32 G] from OpenAI's MXFP4 blocks [N, G, 16] and e8m0 scales [N, G] (uint8),
    as GGUF mxfp4 blocks: the same scale byte (value 2^(s - 127) times the e2m1 value, which
    GGUF writes as 2^(s - 128) times the doubled value), and the codes reordered: OpenAI's byte
    j holds weights 2j (low nibble) and 2j + 1, GGUF's weights j (low) and j + 16."""
    blocks = np.asarray(blocks, dtype=np.uint8)
    rows, groups = blocks.shape[0], blocks.shape[1]
    codes = np.empty((rows, groups, 32), np.uint8)
    codes[..., 0::2] = blocks & 0x0F
    codes[..., 1::2] = blocks >> 4
    data = np.empty((rows, groups, 17), np.uint8)
    data[..., 0] = np.asarray(scales, dtype=np.uint8)
    data[..., 1:] = codes[..., :16] | (codes[..., 16:] << 4)
    return QuantizedTensor("mxfp4", data.reshape(rows, groups * 17), (rows, groups * 32))


def _fused_biases(reader: TensorReader, prefix: str, count: int, hidden: int, inner: int
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """(gate then up bias [2I], down bias [H]) of each expert, from the fused, interleaved
    Hugging Face biases."""
    gate_up = reader.array(f"{prefix}gate_up_proj_bias", (count, 2 * inner))
    down = reader.array(f"{prefix}down_proj_bias", (count, hidden))
    return [(np.concatenate([gate_up[e][0::2], gate_up[e][1::2]]), down[e])
            for e in range(count)]


def _mxfp4_experts(reader: TensorReader, prefix: str, count: int, hidden: int, inner: int
                   ) -> list[tuple[Any, Any, Any, Any]]:
    """(gate then up rows [2I, H], their bias, down [H, I], its bias) of each expert, the
    matrices as GGUF mxfp4 blocks."""
    for size, name in ((hidden, "hidden_size"), (inner, "intermediate_size")):
        if size % 32:
            raise WeightError(f"{reader.source}: MXFP4 experts need a {name} that is a multiple "
                              f"of 32, got {size}")
    name = f"{prefix}gate_up_proj"
    gate_up = (reader.get(name + "_blocks", (count, 2 * inner, hidden // 32, 16)),
               reader.get(name + "_scales", (count, 2 * inner, hidden // 32)))
    name = f"{prefix}down_proj"
    down = (reader.get(name + "_blocks", (count, hidden, inner // 32, 16)),
            reader.get(name + "_scales", (count, hidden, inner // 32)))
    order = np.concatenate([np.arange(0, 2 * inner, 2), np.arange(1, 2 * inner, 2)])
    biases = _fused_biases(reader, prefix, count, hidden, inner)
    return [(mxfp4_rows(np.asarray(gate_up[0][e])[order], np.asarray(gate_up[1][e])[order]),
             biases[e][0], mxfp4_rows(down[0][e], down[1][e]), biases[e][1])
            for e in range(count)]


def _dense_experts(reader: TensorReader, prefix: str, count: int, hidden: int, inner: int
                   ) -> list[tuple[Any, Any, Any, Any]]:
    """(gate then up rows [2I, H], their bias, down [H, I], its bias) of each expert, float32."""
    gate_up = reader.array(f"{prefix}gate_up_proj", (count, hidden, 2 * inner))
    down = reader.array(f"{prefix}down_proj", (count, inner, hidden))
    biases = _fused_biases(reader, prefix, count, hidden, inner)
    return [(np.ascontiguousarray(np.concatenate([gate_up[e].T[0::2], gate_up[e].T[1::2]])),
             biases[e][0], np.ascontiguousarray(down[e].T), biases[e][1])
            for e in range(count)]


def _separate_experts(reader: TensorReader, prefix: str, count: int, hidden: int, inner: int
                      ) -> list[tuple[Any, Any, Any, Any]]:
    """The same from one expert at a time (`{prefix}{e}.gate_proj.weight`, `.bias`, and so on
    for up and down; GGUF files' stacks, sliced), the matrices as stored. Each kind is read
    for every expert in turn, so a stack decoded once serves all its experts."""
    def every(kind: str, what: str, shape: tuple[int, ...]) -> list[Any]:
        read = reader.get if what == "weight" else reader.array
        return [read(f"{prefix}{e}.{kind}_proj.{what}", shape) for e in range(count)]

    gates, ups = (every(kind, "weight", (inner, hidden)) for kind in ("gate", "up"))
    downs = every("down", "weight", (hidden, inner))
    gate_biases, up_biases = (every(kind, "bias", (inner,)) for kind in ("gate", "up"))
    down_biases = every("down", "bias", (hidden,))
    return [(stack_rows([gates[e], ups[e]]), np.concatenate([gate_biases[e], up_biases[e]]),
             downs[e], down_biases[e]) for e in range(count)]


def load_clamped_experts(be: Backend, reader: TensorReader, prefix: str, count: int,
                         hidden: int, inner: int, alpha: float, limit: float
                         ) -> list[ClampedSwiGLUExpert]:
    """The experts under `prefix`: Hugging Face's fused, transposed layout, OpenAI's MXFP4
    blocks (`gate_up_proj_blocks` / `_scales` [E, 2I, H / 32, (16)], `down_proj_blocks` /
    `_scales` [E, H, I / 32, (16)]), kept as GGUF mxfp4 blocks, or one expert at a time."""
    if reader.has(f"{prefix}gate_up_proj_blocks"):
        load = _mxfp4_experts
    elif reader.has(f"{prefix}0.gate_proj.weight"):
        load = _separate_experts
    else:
        load = _dense_experts
    return [ClampedSwiGLUExpert(
        gate_up=be.matrix(gate_up), gate_up_bias=be.vector(gate_up_bias), down=be.matrix(down),
        down_bias=be.vector(down_bias), alpha=alpha, limit=limit)
        for gate_up, gate_up_bias, down, down_bias in load(reader, prefix, count, hidden, inner)]
