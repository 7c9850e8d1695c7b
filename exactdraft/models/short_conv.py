"""The gated short convolution of LFM2, run row by row on the host between two backend matmuls.

Invariant: the layer keeps recurrent.py's contract (its module docstring gives the host
arithmetic): a row's bits depend only on that row and the state before it, the state after
every position is kept for rollback, and no state array is changed in place.

For hidden rows x (already RMS-normed by the model), of width H, and a kernel of K taps:
    B, C, u = x in_proj^T (+ bias) (one backend matmul; rows in that order)
    y = C * (causal_conv(B * u) + conv bias) (depthwise, its own state of the last K-1
        inputs B * u)
    out = y out_proj^T (+ bias)
Every step between the matmuls is elementwise per channel: float32 products, and the
convolution's taps added in the one order causal_conv fixes, whatever the pass size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend
from exactdraft.models.mixers import PassContext
from exactdraft.models.recurrent import F32, causal_conv


@dataclass
class ShortConv:
    in_proj: Any  # matrix [3 H, H]: B, C, u
    out_proj: Any  # matrix [H, H]
    conv_weight: np.ndarray  # float32 [K, H]: tap j multiplies the input K-1-j steps back
    conv_bias: np.ndarray | None  # float32 [H]
    hidden_size: int
    slot: int  # this layer's place in a SequenceState's recurrent states
    in_bias: Any = None
    out_bias: Any = None

    def empty_state(self) -> tuple[np.ndarray]:
        """(the convolution's last K-1 inputs [K-1, H]) before any token."""
        taps = self.conv_weight.shape[0]
        return (np.zeros((taps - 1, self.hidden_size), F32),)

    def run(self, be: Backend, x: Any, ctx: PassContext) -> Any:
        proj = be.to_host(be.linear(x, self.in_proj, self.in_bias))
        rows = ctx.each_sequence(proj, self._sequence)
        return be.linear(be.vector(rows), self.out_proj, self.out_bias)

    def _sequence(self, part: Any, proj: np.ndarray) -> np.ndarray:
        count, hidden = proj.shape[0], self.hidden_size
        b, c, u = proj[:, :hidden], proj[:, hidden:2 * hidden], proj[:, 2 * hidden:]
        (previous,) = part.state.recurrent[self.slot]
        mixed, window = causal_conv(previous, b * u, self.conv_weight, self.conv_bias)
        taps = self.conv_weight.shape[0]
        part.state.recurrent[self.slot] = (window[count:count + taps - 1],)
        part.row_states[self.slot] = [(window[t + 1:t + taps],)
                                      for t in range(part.keep_from, count)]
        return c * mixed
