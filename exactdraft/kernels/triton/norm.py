"""Row-invariant RMS norm as a Triton kernel: one row per program, one fixed reduction order.

Invariant: a row's output depends only on that row, the weight and eps. Each program owns one
row; the sum of squares is accumulated elementwise across fixed BLOCK-wide slices of the row (a
function of the row length alone) and reduced once at the end, so the order of additions is the
same for every row count. The formula is the torch backend's (and Hugging Face's):
    normed = x / sqrt(mean(x * x) + eps)        in float32, correctly rounded sqrt and division
    out    = weight * normed.to(x.dtype)        rounded to x's dtype, nearest-even
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from exactdraft.kernels.triton.launch import (
    PINNED_OPTIONS,
    KernelError,
    aligned,
    check_device,
    dtype_name,
    next_power_of_2,
)
from exactdraft.kernels.triton.rounding import round_to_dtype

MAX_BLOCK = 4096


@triton.jit(do_not_specialize=["K"])
def _rms_norm_kernel(x_ptr, weight_ptr, out_ptr, K, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * K
    offsets = tl.arange(0, BLOCK)
    squares = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, K, BLOCK):
        cols = start + offsets
        x = tl.load(x_ptr + row + cols, mask=cols < K, other=0.0).to(tl.float32)
        squares += x * x
    mean = tl.div_rn(tl.sum(squares, axis=0), K.to(tl.float32))
    root = tl.sqrt_rn(mean + eps)
    for start in range(0, K, BLOCK):
        cols = start + offsets
        mask = cols < K
        x = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
        normed = round_to_dtype(tl.div_rn(x, root), out_ptr.dtype.element_ty).to(tl.float32)
        weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        out = round_to_dtype(weight * normed, out_ptr.dtype.element_ty)
        tl.store(out_ptr + row + cols, out, mask=mask)


def rms_norm_block(length: int) -> int:
    """The slice width for rows of `length` elements (the row count plays no part)."""
    return min(next_power_of_2(length), MAX_BLOCK)


def rms_norm(x: Any, weight: Any, eps: float) -> Any:
    """RMS norm over the last dimension of x [..., K] with weight [K]; result in x's dtype."""
    import torch

    length = x.shape[-1]
    if tuple(weight.shape) != (length,):
        raise KernelError(f"weight must have shape ({length},), got {tuple(weight.shape)}")
    if not eps >= 0:
        raise KernelError(f"eps must be a non-negative number, got {eps!r}")
    dtype_name(x)
    check_device(_rms_norm_kernel, x, weight)
    flat = aligned(x.reshape(-1, length))
    out = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
    if flat.shape[0] == 0 or length == 0:
        return out.reshape(x.shape)
    weight = aligned(weight)
    _rms_norm_kernel[(flat.shape[0],)](flat, weight, out, length, float(eps),
                                       BLOCK=rms_norm_block(length), num_warps=4,
                                       **PINNED_OPTIONS)
    return out.reshape(x.shape)
