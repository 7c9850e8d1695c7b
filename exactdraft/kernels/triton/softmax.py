"""Row-invariant softmax and log-softmax over the last dimension, as Triton kernels.

Invariant: a row's output depends only on that row. Each program owns one row and makes three
passes over it in fixed BLOCK-wide slices (BLOCK a function of the row length alone): the
maximum (exact in any order), the sum of exp(x - max) accumulated elementwise across slices and
reduced once, then the outputs. The result is float32 whatever the input dtype, because these
feed sampling, where the extra bits matter more than the bytes.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

from exactdraft.kernels.triton.launch import (
    PINNED_OPTIONS,
    aligned,
    check_device,
    dtype_name,
    next_power_of_2,
)

MAX_BLOCK = 4096


@triton.jit(do_not_specialize=["V"])
def _softmax_kernel(x_ptr, out_ptr, V, LOG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * V
    offsets = tl.arange(0, BLOCK)
    running_max = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + offsets
        x = tl.load(x_ptr + row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        running_max = tl.maximum(running_max, x)
    top = tl.max(running_max, axis=0)
    sums = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + offsets
        x = tl.load(x_ptr + row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        sums += tl.exp(x - top)
    total = tl.sum(sums, axis=0)
    log_total = tl.log(total)
    for start in range(0, V, BLOCK):
        cols = start + offsets
        mask = cols < V
        x = tl.load(x_ptr + row + cols, mask=mask, other=float("-inf")).to(tl.float32)
        if LOG:
            out = (x - top) - log_total
        else:
            out = tl.div_rn(tl.exp(x - top), total)
        tl.store(out_ptr + row + cols, out, mask=mask)


def softmax_block(length: int) -> int:
    """The slice width for rows of `length` elements (the row count plays no part)."""
    return min(next_power_of_2(length), MAX_BLOCK)


def _launch(x: Any, log: bool) -> Any:
    import torch

    dtype_name(x)
    check_device(_softmax_kernel, x)
    length = x.shape[-1]
    flat = aligned(x.reshape(-1, length))
    out = torch.empty(flat.shape, dtype=torch.float32, device=x.device)
    if flat.shape[0] and length:
        _softmax_kernel[(flat.shape[0],)](flat, out, length, LOG=log,
                                          BLOCK=softmax_block(length), num_warps=4,
                                          **PINNED_OPTIONS)
    return out.reshape(x.shape)


def softmax(x: Any) -> Any:
    """softmax over the last dimension of x [..., V] -> float32 [..., V]."""
    return _launch(x, log=False)


def log_softmax(x: Any) -> Any:
    """log_softmax over the last dimension of x [..., V] -> float32 [..., V]."""
    return _launch(x, log=True)
