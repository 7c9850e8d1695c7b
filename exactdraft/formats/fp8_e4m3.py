"""The fp8_e4m3 weight format: float8_e4m3fn codes with one float32 scale per block of 32
weights of a row, the form in which block-scaled FP8 checkpoints (DeepSeek-V3 and R1, Qwen3 FP8:
one `weight_scale_inv` per 128x128 block) are held in memory.

Invariant: weight j of a block is float32(e4m3fn code j) * float32(the block's scale), one
float32 multiply rounded to nearest-even: bit for bit the value the checkpoint's block
dequantization gives (exactdraft.loading.fp8_blocks.dequantize_blocks), since each block of 32
weights lies inside one checkpoint block and carries that block's scale unchanged. The codes
decode exactly by bit arithmetic (every e4m3fn value is a float32).

Block (36 B): scale float32 little-endian @0, codes uint8[32] @4; weight j is codes[j]. The
format has no GGUF type: it is never read from or written to a GGUF file.
"""

from __future__ import annotations

import numpy as np

BLOCK_WEIGHTS = 32
BLOCK_BYTES = 4 + BLOCK_WEIGHTS
NAN_CODES = (0x7F, 0xFF)  # S.1111.111; e4m3fn has no infinities


def e4m3fn_values() -> np.ndarray:
    """The float32 value of each of the 256 float8_e4m3fn codes, by bit arithmetic: sign,
    4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal (mantissa * 2**-9);
    no infinities, and S.1111.111 is NaN."""
    codes = np.arange(256, dtype=np.uint32)
    sign, exponent, mantissa = codes >> 7, (codes >> 3) & 0xF, codes & 0x7
    # A normal code's float32 bits: the same sign, the exponent rebiased from 7 to 127, the
    # mantissa in the top three of float32's 23 bits.
    bits = (sign << 31) | ((exponent + 120) << 23) | (mantissa << 20)
    values = bits.view(np.float32).copy()
    subnormal = exponent == 0
    values[subnormal] = (mantissa[subnormal].astype(np.float32) * np.float32(2.0 ** -9)
                         * np.where(sign[subnormal] == 1, np.float32(-1), np.float32(1)))
    values[list(NAN_CODES)] = np.float32("nan")
    return values


E4M3FN_VALUES = e4m3fn_values()


def values_fp8_e4m3(blocks: np.ndarray, out: np.ndarray) -> None:
    """fp8_e4m3: `w = value(code) * scale`, one float32 multiply (the module invariant)."""
    scale = blocks[:, :4].copy().view("<f4").astype(np.float32)  # [n, 1]
    np.multiply(E4M3FN_VALUES[blocks[:, 4:]], scale, out=out)


def pack_fp8_e4m3(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """uint8 rows [R, C / 32 * 36] of this format from e4m3fn `codes` uint8 [R, C] and the
    float32 scale of each block of 32 weights of a row, `scales` [R, C / 32]."""
    rows, columns = codes.shape
    blocks = np.empty((rows, columns // BLOCK_WEIGHTS, BLOCK_BYTES), np.uint8)
    blocks[..., :4] = np.ascontiguousarray(scales, dtype="<f4").view(np.uint8).reshape(
        rows, columns // BLOCK_WEIGHTS, 4)
    blocks[..., 4:] = codes.reshape(rows, columns // BLOCK_WEIGHTS, BLOCK_WEIGHTS)
    return blocks.reshape(rows, -1)
