"""Row-invariant matrix multiply `x @ w.T (+ bias)` as a Triton kernel.

Invariant: an output element's bits depend only on its own row of x, the weight and the bias,
never on how many rows the call has or where the row sits in it. The argument:
- the configuration (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) is a function of the weight shape
  [N, K], its dtype and the device type alone (`matmul_config`); the row count M is a runtime
  argument Triton does not specialise on, so every M runs the same compiled kernel;
- there is no split-K: one program owns a BLOCK_M x BLOCK_N output tile and walks K from 0 to K
  in BLOCK_K steps, in order, accumulating in float32. The K tiles of element (m, n) are therefore
  the same tiles, added in the same order, for every M;
- M and N only choose which program computes a tile; the tiles themselves have one fixed shape.
  Rows past M inside the last tile are loaded as zeros and never stored; they enter no other
  row's sums, because a dot product reduces over K only;
- BLOCK_M is fixed at 16 for every M rather than growing with M: a larger M-tile would switch the
  tensor-core instruction (mma.sync to wgmma on Hopper), whose internal rounding need not match.
  Small tiles also keep decode and verify passes (M = 1..16) from paying for 128-row tiles.
What is left is that the hardware dot instruction gives an element the same bits whichever row
of its tile it occupies; that holds for the interpreter's rowwise reduction by construction and
is checked on the GPU itself (benchmarks/gpu_check.py). Inputs are float32, bfloat16 or float16;
x and w share one dtype; the output has x's dtype, rounded once from the float32 accumulator
(bias included) to nearest-even.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import triton
import triton.language as tl

from exactdraft.kernels.triton.launch import (
    PINNED_OPTIONS,
    KernelError,
    aligned,
    check_device,
    dtype_name,
    rowwise_dot,
)
from exactdraft.kernels.triton.rounding import round_to_dtype


@dataclass(frozen=True)
class MatmulConfig:
    """One compiled kernel variant; chosen per weight, never per call."""

    block_m: int = 16
    block_n: int = 32
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3


def matmul_config(n: int, k: int, dtype: str, device_type: str) -> MatmulConfig:
    """The configuration for a weight [n, k] of `dtype` on `device_type` (no row count here)."""
    if device_type == "cpu":
        # The interpreter runs one program at a time in numpy; medium tiles keep it quick.
        return MatmulConfig(block_m=16, block_n=32, block_k=64, num_warps=1, num_stages=1)
    # Narrow N-tiles give decode passes enough programs to fill the GPU without splitting K.
    block_n = 32 if n <= 8192 else 64
    block_k = 64 if dtype == "float32" else 128
    return MatmulConfig(block_m=16, block_n=block_n, block_k=block_k, num_warps=4,
                        num_stages=3 if dtype == "float32" else 4)


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(x_ptr, w_ptr, bias_ptr, out_ptr, M, N, K,
                   HAS_BIAS: tl.constexpr, ROWWISE: tl.constexpr, IEEE_FP32: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    steps = tl.arange(0, BLOCK_K)
    row_offsets = rows.to(tl.int64)[:, None] * K
    col_offsets = cols.to(tl.int64)[None, :] * K
    row_mask = rows[:, None] < M
    col_mask = cols[None, :] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + steps
        a = tl.load(x_ptr + row_offsets + ks[None, :], mask=row_mask & (ks[None, :] < K),
                    other=0.0)
        b = tl.load(w_ptr + col_offsets + ks[:, None], mask=col_mask & (ks[:, None] < K),
                    other=0.0)
        if ROWWISE:
            # Each element reduces its own products over the BLOCK_K axis: no row coupling.
            acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
        elif IEEE_FP32:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    out = round_to_dtype(acc, out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * N + cols[None, :], out,
             mask=row_mask & col_mask)


def matmul(x: Any, w: Any, bias: Any | None = None, *, dot: str = "auto",
           config: MatmulConfig | None = None) -> Any:
    """x [M, K] @ w[N, K].T (+ bias [N]) -> [M, N] in x's dtype, float32 accumulation.

    `dot` picks the dot step ("auto", "native" for tl.dot, "rowwise"); `config` overrides the
    weight's configuration and exists for tests that show what an M-dependent choice breaks.
    """
    import torch

    if x.dim() != 2 or w.dim() != 2:
        raise KernelError(f"matmul needs x [M, K] and w [N, K], got {tuple(x.shape)} and "
                          f"{tuple(w.shape)}")
    rows, depth = x.shape
    width = w.shape[0]
    if w.shape[1] != depth:
        raise KernelError(f"x has K = {depth} but w has K = {w.shape[1]}")
    if x.dtype != w.dtype:
        raise KernelError(f"x is {x.dtype} but w is {w.dtype}; they must share one dtype")
    dtype = dtype_name(x)
    if bias is not None and tuple(bias.shape) != (width,):
        raise KernelError(f"bias must have shape ({width},), got {tuple(bias.shape)}")
    tensors = (x, w) if bias is None else (x, w, bias)
    device_type = check_device(_matmul_kernel, *tensors)
    config = config or matmul_config(width, depth, dtype, device_type)
    out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    has_bias = bias is not None
    x, w = aligned(x), aligned(w)
    # Without a bias the kernel never reads bias_ptr; `out` only fills the slot.
    bias = aligned(bias) if has_bias else out
    grid = (triton.cdiv(rows, config.block_m), triton.cdiv(width, config.block_n))
    _matmul_kernel[grid](
        x, w, bias, out, rows, width, depth,
        HAS_BIAS=has_bias, ROWWISE=rowwise_dot(dot, _matmul_kernel),
        IEEE_FP32=dtype == "float32",
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages, **PINNED_OPTIONS,
    )
    return out
