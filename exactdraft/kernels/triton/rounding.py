"""Rounding a float32 tile to the output dtype the same way in compiled code and the interpreter.

Invariant: a stored value is the float32 result rounded to nearest, ties to even, whichever way
the kernel runs. Compiled Triton already rounds that way; Triton's CPU interpreter truncates
float32 to bfloat16 instead (and flushes subnormals), so the bfloat16 bits are made here with
integer operations that mean the same thing on both. Rounding is elementwise, so it can never
couple two rows.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to_dtype(x, dtype: tl.constexpr):
    """Round float32 `x` to `dtype` (float32, float16 or bfloat16), nearest-even."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        # Adding 0x7FFF plus the lowest kept bit carries into the kept bits exactly when the
        # dropped half is above one half, or equal to it with an odd kept part (ties to even).
        upper = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
        # A NaN whose payload sits in the dropped bits would carry or truncate to infinity.
        upper = tl.where(x == x, upper, 0x7FC0)
        # Bits, not a value cast: the interpreter's own cast also mangles subnormals.
        return upper.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)
