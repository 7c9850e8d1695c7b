"""YaRN rotary scaling (the long-context rope of DeepSeek-V3 and gpt-oss): its frequencies, the
factor its cos and sin rows carry, and the score scale of multi-head latent attention.

Invariant: as for every rope table (blocks.py), a row of cos and sin depends on its position,
the frequencies and the factor alone, computed in float64 with exactdraft's own functions and
rounded to float32 once, so it has the same bits whichever pass first asked for it.

The frequencies blend, per pair i, the plain frequency theta^(-2i/D) with the interpolated one
(divided by `factor`) by a linear ramp between the correction dimensions of `beta_fast` and
`beta_slow` rotations over the original context; cos and sin are multiplied by
`attention_factor` (mscale(factor, mscale) / mscale(factor, mscale_all_dim) where both are
given, mscale(factor) otherwise, with mscale(s, m) = 0.1 m ln s + 1 for s > 1, else 1); and the
attention score scale is multiplied by mscale(factor, mscale_all_dim)^2 where mscale_all_dim is
given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from exactdraft import float64_math
from exactdraft.models.blocks import RopeTable, rope_frequencies
from exactdraft.models.config import ConfigReader


@dataclass(frozen=True)
class YarnScaling:
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


def yarn_from_hf(reader: ConfigReader) -> YarnScaling | None:
    """The yarn scaling of config.json (`rope_parameters`, or `rope_scaling` before
    transformers 5), None for the plain rope; any other scaling type is refused by name."""
    for key in ("rope_parameters", "rope_scaling"):
        raw = reader.value(key, {}) or {}
        if not isinstance(raw, Mapping):
            raise reader.fail(key, f"must be an object, got {raw!r}")
        rope_type = raw.get("rope_type", raw.get("type"))
        if rope_type not in (None, "default"):
            break
    else:
        return None
    if rope_type != "yarn":
        raise reader.fail(key, f"has unsupported type {rope_type!r}; supported: yarn")
    scaling = ConfigReader(raw, reader.source)
    original = scaling.int("original_max_position_embeddings")
    factor = scaling.float("factor", None) or \
        reader.int("max_position_embeddings") / original
    optional = {name: scaling.float(name, None) for name in
                ("mscale", "mscale_all_dim", "attention_factor")}
    return YarnScaling(factor=factor, original_max_position_embeddings=original,
                       beta_fast=scaling.float("beta_fast", 32.0),
                       beta_slow=scaling.float("beta_slow", 1.0),
                       truncate=scaling.bool("truncate", True), **optional)


def yarn_from_gguf(reader: ConfigReader) -> YarnScaling | None:
    """llama.cpp's rope.scaling.* metadata (a reader of the architecture's keys): type yarn,
    factor, original_context_length, yarn_beta_fast/slow, and yarn_log_multiplier, which its
    DeepSeek converter writes as 0.1 * mscale_all_dim; cos and sin then carry no factor
    (llama.cpp's mscale and mscale_all_dim are one)."""
    kind = reader.value("rope.scaling.type", None)
    if kind in (None, "none"):
        return None
    if kind != "yarn":
        raise reader.fail("rope.scaling.type", f"{kind!r} is not supported; supported: yarn")
    multiplier = reader.float("rope.scaling.yarn_log_multiplier", 0.0, positive=False)
    return YarnScaling(
        factor=reader.float("rope.scaling.factor"),
        original_max_position_embeddings=reader.int("rope.scaling.original_context_length"),
        beta_fast=reader.float("rope.scaling.yarn_beta_fast", 32.0),
        beta_slow=reader.float("rope.scaling.yarn_beta_slow", 1.0),
        mscale_all_dim=multiplier / 0.1 if multiplier else None, attention_factor=1.0)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_frequencies(dim: int, theta: float, yarn: YarnScaling) -> np.ndarray:
    """Inverse frequencies [dim / 2] in float64."""
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    powers = float64_math.power(theta, exponents)
    # Formed as transformers forms them: 1 / powers and 1 / (factor * powers).
    plain, interpolated = 1.0 / powers, 1.0 / (yarn.factor * powers)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(yarn.original_max_position_embeddings /
                              (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(yarn.beta_fast), correction_dim(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolated = 1.0 - ramp
    return interpolated * (1.0 - extrapolated) + plain * extrapolated


def yarn_attention_factor(yarn: YarnScaling) -> float:
    """The factor cos and sin carry."""
    if yarn.attention_factor is not None:
        return yarn.attention_factor
    if yarn.mscale and yarn.mscale_all_dim:
        return yarn_mscale(yarn.factor, yarn.mscale) / yarn_mscale(yarn.factor,
                                                                   yarn.mscale_all_dim)
    return yarn_mscale(yarn.factor)


def yarn_score_scale(yarn: YarnScaling | None, scale: float) -> float:
    """The attention score scale with mscale_all_dim folded in (latent attention only)."""
    if yarn is None or not yarn.mscale_all_dim:
        return scale
    mscale = yarn_mscale(yarn.factor, yarn.mscale_all_dim)
    return scale * mscale * mscale


class ScaledRopeTable(RopeTable):
    """A RopeTable whose cos and sin rows are multiplied by `factor` (float32 by float32, as
    each row is first built)."""

    def __init__(self, inv_freq: np.ndarray, factor: float) -> None:
        super().__init__(inv_freq)
        self.factor = float(factor)

    def _grow(self, length: int) -> None:
        built = self.cos.shape[0]
        super()._grow(length)
        factor = np.float32(self.factor)
        self.cos = np.concatenate([self.cos[:built], self.cos[built:] * factor])
        self.sin = np.concatenate([self.sin[:built], self.sin[built:] * factor])


def yarn_rope(dim: int, theta: float, yarn: YarnScaling | None) -> RopeTable:
    """The rope table of `dim` rotary dimensions: yarn's, or the plain one without it."""
    if yarn is None:
        return RopeTable(rope_frequencies(dim, theta, None))
    return ScaledRopeTable(yarn_frequencies(dim, theta, yarn), yarn_attention_factor(yarn))
