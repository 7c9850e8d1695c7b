"""Gated DeltaNet, the linear-attention layer of Qwen3-Next and Qwen3.5, run token by token.

Invariant: the layer keeps recurrent.py's contract (its module docstring gives the host
arithmetic): a row's bits depend only on that row and the state before it, the state after
every position is kept for rollback, and no state array is changed in place.

For hidden rows x (already RMS-normed by the model), with Hk key heads and Hv value heads of
sizes Dk and Dv:
    q, k, v, z, b, a = x in_proj^T (one backend matmul; rows in that order)
    [q k v] = silu(causal_conv(q k v)) (kernel K, no bias, its own state of K-1 inputs)
    q = l2norm(q) Dk**-0.5, k = l2norm(k) (eps 1e-6), each key head serving Hv/Hk value heads
    beta = sigmoid(b); decay = exp(-exp(A_log) softplus(a + dt_bias)) (float64, then float32)
    per token, per value head, with S [Dk, Dv]:
        S = S decay; S = S + k (beta (v - sum_i S[i] k[i]))^T; o = sum_i S[i] q[i]
    out = out_proj(rms_norm(o) w silu(z)) (the gated norm over Dv, eps rms_norm_eps)
Sums over Dk are tree_sums; S is held as [Dk, Hv, Dv] so the tree halves contiguous blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft import float64_math
from exactdraft.backends.base import Backend
from exactdraft.models.mixers import PassContext
from exactdraft.models.recurrent import (
    F32,
    causal_conv,
    l2_normalized,
    rms_normalized,
    sigmoid32,
    silu32,
    tree_sum,
)


@dataclass
class GatedDeltaNet:
    in_proj: Any  # matrix [2 Hk Dk + 2 Hv Dv + 2 Hv, H]: q, k, v, z, b, a
    out_proj: Any  # matrix [H, Hv Dv]
    conv_weight: np.ndarray  # float32 [K, 2 Hk Dk + Hv Dv]
    decay_rate: np.ndarray  # float64 exp(A_log) [Hv]
    dt_bias: np.ndarray  # float64 [Hv]
    norm_weight: np.ndarray  # float32 [Dv]
    num_key_heads: int
    num_value_heads: int
    key_dim: int
    value_dim: int
    eps: float
    slot: int  # this layer's place in a SequenceState's recurrent states

    @property
    def conv_channels(self) -> int:
        return 2 * self.num_key_heads * self.key_dim + self.num_value_heads * self.value_dim

    def empty_state(self) -> tuple[np.ndarray, np.ndarray]:
        """(the convolution's last K-1 inputs, S [Dk, Hv, Dv]) before any token."""
        taps = self.conv_weight.shape[0]
        return (np.zeros((taps - 1, self.conv_channels), F32),
                np.zeros((self.key_dim, self.num_value_heads, self.value_dim), F32))

    def run(self, be: Backend, x: Any, ctx: PassContext) -> Any:
        proj = be.to_host(be.linear(x, self.in_proj))
        rows = ctx.each_sequence(proj, self._sequence)
        return be.linear(be.vector(rows), self.out_proj)

    def _sequence(self, part: Any, proj: np.ndarray) -> np.ndarray:
        count = proj.shape[0]
        hk, hv, dk, dv = self.num_key_heads, self.num_value_heads, self.key_dim, self.value_dim
        channels, values = self.conv_channels, hv * dv
        conv_state, state = part.state.recurrent[self.slot]
        pre, window = causal_conv(conv_state, proj[:, :channels], self.conv_weight, None)
        # silu of the convolution's outputs and of the gate z, in one call.
        activated = silu32(np.concatenate([pre, proj[:, channels:channels + values]], axis=1))
        mixed, z = activated[:, :channels], activated[:, channels:].reshape(count, hv, dv)
        b = proj[:, channels + values:channels + values + hv]
        a = proj[:, channels + values + hv:]
        group = hv // hk
        q = l2_normalized(mixed[:, :hk * dk].reshape(count, hk, dk)) * F32(dk ** -0.5)
        k = l2_normalized(mixed[:, hk * dk:2 * hk * dk].reshape(count, hk, dk))
        # [count, Dk, Hv]: key head j serves value heads j * group .. (j + 1) * group - 1.
        q = np.repeat(q, group, axis=1).transpose(0, 2, 1)
        k = np.repeat(k, group, axis=1).transpose(0, 2, 1)
        v = mixed[:, 2 * hk * dk:].reshape(count, hv, dv)
        beta = sigmoid32(b)
        softplus = float64_math.softplus(a.astype(np.float64) + self.dt_bias)
        decay = float64_math.exp(-self.decay_rate * softplus).astype(F32)
        out, state, kept = self.scan(state, q, k, v, beta, decay, part.keep_from)
        taps = self.conv_weight.shape[0]
        part.state.recurrent[self.slot] = (window[count:count + taps - 1], state)
        part.row_states[self.slot] = [(window[t + 1:t + taps], s)
                                      for t, s in zip(range(part.keep_from, count), kept)]
        gated = rms_normalized(out, self.eps) * self.norm_weight * z
        return gated.reshape(count, values)

    def scan(self, state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
             beta: np.ndarray, decay: np.ndarray, keep_from: int
             ) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """The recurrence over the rows in order: outputs [M, Hv, Dv], the final state, and
        the states after rows keep_from.. ."""
        count = v.shape[0]
        out = np.empty(v.shape, F32)
        kept = []
        for t in range(count):
            key = k[t][:, :, None]
            state = state * decay[t][None, :, None]
            remembered = tree_sum(state * key, 0)
            state = state + key * ((v[t] - remembered) * beta[t][:, None])[None]
            out[t] = tree_sum(state * q[t][:, :, None], 0)
            if t >= keep_from:
                kept.append(state)
        return out, state, kept
