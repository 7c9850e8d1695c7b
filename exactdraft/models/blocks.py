"""Rotary embeddings, shared by every family's attention: frequencies and their cos/sin rows.

Invariant: a row of cos and sin depends on its position and the frequencies alone, computed
with exactdraft's own float64 functions, so it has the same bits on every machine, whichever
pass first asked for it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from exactdraft import float64_math
from exactdraft.backends.base import Backend
from exactdraft.models.config import RopeScaling


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """Inverse frequencies [head_dim / 2] in float64, with llama3/linear scaling applied;
    computed with exactdraft's own float64 power, so the same on every machine."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    inv_freq = 1.0 / float64_math.power(theta, exponents)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    old_context = scaling.original_max_position_embeddings
    low_wavelen = old_context / scaling.low_freq_factor
    high_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


class RopeTable:
    """cos and sin [positions, head_dim / 2] of one set of frequencies, from exactdraft's own
    float64 sin and cos (numpy's differ between machines in the last bit). Rows are computed
    as positions are first used: row p depends on p alone, so growing the table never changes
    a row."""

    def __init__(self, inv_freq: np.ndarray) -> None:
        self.inv_freq = np.asarray(inv_freq, dtype=np.float64)
        empty = np.zeros((0, self.inv_freq.size), np.float32)
        self.cos, self.sin = empty, empty  # float32 [built, head_dim / 2] on the host

    def _grow(self, length: int) -> None:
        built = self.cos.shape[0]
        if length <= built:
            return
        length = max(length, 2 * built, 256)
        angles = np.arange(built, length, dtype=np.float64)[:, None] * self.inv_freq
        sine, cosine = float64_math.sincos(angles)
        self.cos = np.concatenate([self.cos, cosine.astype(np.float32)])
        self.sin = np.concatenate([self.sin, sine.astype(np.float32)])

    def rows(self, backend: Backend, positions: np.ndarray) -> tuple[Any, Any]:
        """cos and sin rows [len(positions), head_dim / 2] on the backend."""
        self._grow(int(positions.max()) + 1)
        return backend.vector(self.cos[positions]), backend.vector(self.sin[positions])
