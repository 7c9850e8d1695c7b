"""YaRN rotary scaling: interpolated and extrapolated frequencies blended by a linear ramp over
the head's dimensions, and cos/sin scaled by an attention factor.

Invariant: the frequencies are a function of the settings alone, in float64 with exactdraft's
own power, and a scaled cos/sin row is float32(cos) times float32(factor), rounded once, from
the same RopeTable rows: a row depends on its position alone, on every machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft import float64_math
from exactdraft.backends.base import Backend
from exactdraft.models.blocks import RopeTable
from exactdraft.models.config import ConfigReader

F32 = np.float32


@dataclass(frozen=True)
class YarnScaling:
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0


def yarn_from_parameters(reader: ConfigReader) -> YarnScaling:
    """A YaRN scaling from a config's rope parameters (`factor`,
    `original_max_position_embeddings`, optional `beta_fast`, `beta_slow`, `truncate`,
    `attention_factor`, or `mscale` with `mscale_all_dim`)."""
    factor = reader.float("factor")
    attention_factor = reader.float("attention_factor", None)
    if attention_factor is None:
        mscale, mscale_all_dim = reader.float("mscale", None), reader.float("mscale_all_dim", None)
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor, 1.0)
    return YarnScaling(
        factor=factor,
        original_max_position_embeddings=reader.int("original_max_position_embeddings"),
        beta_fast=reader.float("beta_fast", 32.0), beta_slow=reader.float("beta_slow", 1.0),
        truncate=reader.bool("truncate", True), attention_factor=attention_factor)


def yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_frequencies(head_dim: int, theta: float, yarn: YarnScaling) -> np.ndarray:
    """Inverse frequencies [head_dim / 2] in float64."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    powers = float64_math.power(theta, exponents)
    extrapolated, interpolated = 1.0 / powers, 1.0 / (yarn.factor * powers)

    def dimension(rotations: float) -> float:
        return head_dim * math.log(yarn.original_max_position_embeddings /
                                   (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension(yarn.beta_fast), dimension(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as the reference does, so the ramp has a width
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    kept = 1.0 - ramp  # the share of each extrapolated frequency
    return interpolated * (1.0 - kept) + extrapolated * kept


class ScaledRopeTable(RopeTable):
    """A RopeTable whose cos and sin rows are multiplied by float32(factor)."""

    def __init__(self, inv_freq: np.ndarray, factor: float) -> None:
        super().__init__(inv_freq)
        self.factor = F32(factor)

    def rows(self, backend: Backend, positions: np.ndarray) -> tuple[Any, Any]:
        self._grow(int(positions.max()) + 1)
        return (backend.vector(self.cos[positions] * self.factor),
                backend.vector(self.sin[positions] * self.factor))
