"""Mamba-2, the state-space layer of Nemotron-H, run token by token.

Invariant: the layer keeps recurrent.py's contract (its module docstring gives the host
arithmetic): a row's bits depend only on that row and the state before it, the state after
every position is kept for rollback, and no state array is changed in place.

For hidden rows x (already RMS-normed by the model), with H heads of size P, G groups and
state size N:
    gate, xBC, dt = x in_proj^T (+ bias) (one backend matmul)
    [x B C] = silu(causal_conv(xBC) + conv bias) (kernel K, its own state of K-1 inputs)
    dt = clamp(softplus(dt + dt_bias), time_step_min, time_step_max) (float64, then float32),
    dA = exp(dt A) with A = -exp(A_log) (float64, then float32); head h reads group h // (H/G)
    per token, per head, with S [N, P]:
        S = S dA + B (dt x)^T; y = sum_n S[n] C[n] + D x
    out = out_proj(group_rms_norm(y silu(gate)) w) (+ bias), the norm over each of G groups
The clamp is the one transformers' and mamba_ssm's chunked scans apply (their one-token step
skips it; here one rule serves every pass). Sums over N are tree_sums; S is held as [N, H, P].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft import float64_math
from exactdraft.backends.base import Backend
from exactdraft.models.mixers import PassContext
from exactdraft.models.recurrent import F32, causal_conv, rms_normalized, silu32, tree_sum


@dataclass
class Mamba2:
    in_proj: Any  # matrix [I + I + 2 G N + H, hidden]: gate, x, B, C, dt
    out_proj: Any  # matrix [hidden, I]
    conv_weight: np.ndarray  # float32 [K, I + 2 G N]
    conv_bias: np.ndarray | None  # float32 [I + 2 G N]
    a: np.ndarray  # float64 -exp(A_log) [H]
    dt_bias: np.ndarray  # float64 [H]
    skip: np.ndarray  # float32 D [H]
    norm_weight: np.ndarray  # float32 [I]
    num_heads: int
    head_dim: int
    groups: int
    state_size: int
    time_step_min: float
    time_step_max: float
    eps: float
    slot: int
    in_bias: Any = None
    out_bias: Any = None

    @property
    def inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return self.inner + 2 * self.groups * self.state_size

    def empty_state(self) -> tuple[np.ndarray, np.ndarray]:
        taps = self.conv_weight.shape[0]
        return (np.zeros((taps - 1, self.conv_channels), F32),
                np.zeros((self.state_size, self.num_heads, self.head_dim), F32))

    def run(self, be: Backend, x: Any, ctx: PassContext) -> Any:
        proj = be.to_host(be.linear(x, self.in_proj, self.in_bias))
        rows = ctx.each_sequence(proj, self._sequence)
        return be.linear(be.vector(rows), self.out_proj, self.out_bias)

    def _sequence(self, part: Any, proj: np.ndarray) -> np.ndarray:
        count = proj.shape[0]
        heads, dim, groups, size = self.num_heads, self.head_dim, self.groups, self.state_size
        inner, channels = self.inner, self.conv_channels
        conv_state, state = part.state.recurrent[self.slot]
        gate = proj[:, :inner]
        pre, window = causal_conv(conv_state, proj[:, inner:inner + channels],
                                  self.conv_weight, self.conv_bias)
        mixed = silu32(pre)
        xs = mixed[:, :inner].reshape(count, heads, dim)
        per_group = heads // groups
        # [count, N, H]: head h reads group h // per_group.
        b = np.repeat(mixed[:, inner:inner + groups * size].reshape(count, groups, size),
                      per_group, axis=1).transpose(0, 2, 1)
        c = np.repeat(mixed[:, inner + groups * size:].reshape(count, groups, size),
                      per_group, axis=1).transpose(0, 2, 1)
        raw = proj[:, inner + channels:].astype(np.float64) + self.dt_bias
        dt = np.clip(float64_math.softplus(raw), self.time_step_min,
                     self.time_step_max).astype(F32)
        decay = float64_math.exp(dt.astype(np.float64) * self.a).astype(F32)
        y, state, kept = self.scan(state, xs, b, c, dt, decay, part.keep_from)
        taps = self.conv_weight.shape[0]
        part.state.recurrent[self.slot] = (window[count:count + taps - 1], state)
        part.row_states[self.slot] = [(window[t + 1:t + taps], s)
                                      for t, s in zip(range(part.keep_from, count), kept)]
        gated = (y.reshape(count, inner) * silu32(gate)).reshape(count, groups, -1)
        return rms_normalized(gated, self.eps).reshape(count, inner) * self.norm_weight

    def scan(self, state: np.ndarray, xs: np.ndarray, b: np.ndarray, c: np.ndarray,
             dt: np.ndarray, decay: np.ndarray, keep_from: int
             ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """The recurrence over the rows in order: outputs [M, H, P], the final state, and the
        states after rows keep_from.. ."""
        count = xs.shape[0]
        out = np.empty(xs.shape, F32)
        kept = []
        for t in range(count):
            scaled = dt[t][:, None] * xs[t]
            state = state * decay[t][None, :, None] + b[t][:, :, None] * scaled[None]
            out[t] = tree_sum(state * c[t][:, :, None], 0) + self.skip[:, None] * xs[t]
            if t >= keep_from:
                kept.append(state)
        return out, state, kept
