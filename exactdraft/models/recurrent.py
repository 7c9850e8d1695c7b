"""What the recurrent layers (Gated DeltaNet, Mamba-2) share: host arithmetic in one fixed order,
the causal depthwise convolution with its state, and the per-sequence state that rolls back
exactly.

Invariant: a recurrent layer's bits for a row depend on that row and the state it starts from
only, and a sequence's state after position p is the same object however the positions before
it were cut into passes; so a W-row verify pass gives every row the bits of W single steps,
prefill in any chunking leaves the same state, and truncating to a length restores exactly the
state serial decoding has there.

The host arithmetic behind that:
- float32 +, *, / and sqrt on numpy arrays, elementwise (IEEE, correctly rounded, no fused
  multiply-add, so the same bits on every machine numpy runs on);
- reductions along one axis with `tree_sum` only: a fixed pairwise tree (element i meets
  element i + n/2, halving, a zero appended when the count is odd), never numpy's sum, whose
  blocking may vary;
- exp, log, sigmoid, softplus and silu through exactdraft.float64_math in float64, rounded to
  float32 once (numpy's and libm's float32 transcendentals differ between CPUs);
- the recurrences run token by token in the serial order, in the same code for every pass
  size, and no layer ever changes a state array in place: each step makes new arrays.

Rollback: a sequence's state (state.py) keeps, for the latest `rollback_window` positions, the
recurrent state after each position (references to those never-mutated arrays, so keeping them
costs no copy).
truncate(L) restores the snapshot at L when it is held (every length inside the last verify
pass is); for an older L it replays the kept tokens from the empty state, which by the
chunked-prefill invariant gives the same bits (the cost of a prefill). Attention layers' KV
caches truncate by length as everywhere else.
"""

from __future__ import annotations

import numpy as np

from exactdraft import float64_math

F32 = np.float32


def tree_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """The sum along `axis` (0 or -1) by a fixed pairwise tree: with n entries (a zero
    appended if n is odd), entry i is added to entry i + n / 2, and so on until one is left."""
    x = np.asarray(x)
    last = axis in (-1, x.ndim - 1)
    if not last and axis != 0:
        raise ValueError(f"tree_sum reduces axis 0 or the last axis, not {axis}")
    count = x.shape[-1] if last else x.shape[0]
    while count > 1:
        if count % 2:
            pad = np.zeros_like(x[..., :1] if last else x[:1])
            x = np.concatenate([x, pad], axis=-1 if last else 0)
            count += 1
        count //= 2
        x = x[..., :count] + x[..., count:] if last else x[:count] + x[count:]
    return x[..., 0] if last else x[0]


def rms_normalized(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x * x) + eps) over the last axis, float32, mean by tree_sum."""
    x = np.asarray(x, dtype=F32)
    mean = tree_sum(x * x, -1) / F32(x.shape[-1])
    return x * (F32(1.0) / np.sqrt(mean + F32(eps)))[..., None]


def l2_normalized(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum(x * x) + eps) over the last axis, float32, sum by tree_sum."""
    x = np.asarray(x, dtype=F32)
    return x * (F32(1.0) / np.sqrt(tree_sum(x * x, -1) + F32(eps)))[..., None]


def sigmoid32(x: np.ndarray) -> np.ndarray:
    return float64_math.sigmoid(x).astype(F32)


def silu32(x: np.ndarray) -> np.ndarray:
    wide = np.asarray(x, dtype=np.float64)
    return (wide * float64_math.sigmoid(wide)).astype(F32)


def causal_conv(previous: np.ndarray, rows: np.ndarray, weight: np.ndarray,
                bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal convolution of rows [M, C] that follow the inputs `previous` [K-1, C],
    with weight [K, C] (tap j multiplies the input K-1-j steps back): returns the outputs
    [M, C] (taps added in order j = 0..K-1, then the bias) and the inputs window [K-1+M, C],
    whose rows t+1 .. t+K-1 are the convolution's state after row t."""
    window = np.concatenate([previous, np.asarray(rows, dtype=F32)])
    taps, count = weight.shape[0], rows.shape[0]
    out = window[0:count] * weight[0]
    for tap in range(1, taps):
        out = out + window[tap:tap + count] * weight[tap]
    if bias is not None:
        out = out + bias
    return out, window
