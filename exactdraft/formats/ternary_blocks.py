"""Exact float32 dequantization of the ternary and 1-bit GGUF block formats, in pure numpy.

Invariant: as in formats/dequantize.py, every function returns exactly the float32 values its
blocks encode, with the float32 operations of ggml's reference dequantizers in the same order.
Each weight is a small integer code times the block's float16 scale d widened to float32: one
exact product (or, for q1_0, d or its negation), so the bits are ggml's on every platform.

Block layouts (byte offsets within a block; weight j of the block is element j of the output):

tq1_0 (256 weights, 54 B): qs[48] @0, qh[4] @48, d f16 @52. A byte holds five base-3 digits
    ("trits"): trit n of byte v is ((v * 3**n mod 256) * 3) >> 8, in 0..2, so that any byte
    reads as five trits. Weight 32n + m (n < 5, m < 32) is trit n of qs[m]; weight 160 + 16n + m
    (n < 5, m < 16) is trit n of qs[32 + m]; weight 240 + 4n + m (n < 4, m < 4) is trit n of
    qh[m]. w = (trit - 1) * d.
tq2_0 (256 weights, 66 B): qs[64] @0, d f16 @64. Weight 128h + 32l + m (h < 2, l < 4, m < 32)
    is bits 2l..2l+1 of qs[32h + m], q in 0..3; w = (q - 1) * d.
q1_0 (128 weights, 18 B): d f16 @0, qs[16] @2. Weight j is bit j % 8 of qs[j // 8]:
    w = d where it is set, -d where it is clear.

The fields functions split the blocks into unsigned codes with offset 1 (tq: the code itself;
q1_0: twice the bit, so that code - 1 is -1 or +1) and one scale per 32 weights (the block's d,
repeated), the unit the CPU's dot layout works in.
"""

from __future__ import annotations

import numpy as np

_F32 = np.float32
_POWERS_OF_THREE = np.array([1, 3, 9, 27, 81], dtype=np.uint8)


def _scale(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian float16 field at `offset` of every block, widened exactly: [n, 1]."""
    return blocks[:, offset:offset + 2].copy().view("<f2").astype(_F32)


def _trits(packed: np.ndarray, count: int) -> np.ndarray:
    """[n, m] bytes -> [n, count, m] uint8 trits: [:, t, l] is trit t of packed[:, l]."""
    shifted = packed[:, None, :] * _POWERS_OF_THREE[:count, None]  # wraps mod 256 in uint8
    return ((shifted.astype(np.uint16) * 3) >> 8).astype(np.uint8)


def codes_tq1_0(b: np.ndarray) -> np.ndarray:
    """The trits of tq1_0 blocks [n, 54] in weight order, [n, 256] uint8 in 0..2."""
    n = b.shape[0]
    return np.concatenate([_trits(b[:, 0:32], 5).reshape(n, 160),
                           _trits(b[:, 32:48], 5).reshape(n, 80),
                           _trits(b[:, 48:52], 4).reshape(n, 16)], axis=1)


def codes_tq2_0(b: np.ndarray) -> np.ndarray:
    """The 2-bit codes of tq2_0 blocks [n, 66] in weight order, [n, 256] uint8 in 0..3."""
    qs = b[:, 0:64].reshape(-1, 2, 1, 32)
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return ((qs >> shifts) & 3).reshape(-1, 256)


def bits_q1_0(b: np.ndarray) -> np.ndarray:
    """The bits of q1_0 blocks [n, 18] in weight order, [n, 128] uint8 in 0..1."""
    return np.unpackbits(b[:, 2:18], axis=1, bitorder="little")


def values_tq1_0(b: np.ndarray, out: np.ndarray) -> None:
    """tq1_0: `w = (trit - 1) * d`; the code in integers, then one exact multiply. Matches
    ggml's `y = (float)(xi - 1) * d`."""
    codes = codes_tq1_0(b).view(np.int8) - np.int8(1)
    np.multiply(codes, _scale(b, 52), out=out, dtype=_F32)


def values_tq2_0(b: np.ndarray, out: np.ndarray) -> None:
    """tq2_0: `w = (q - 1) * d`, q the 2-bit code (3 reads as 2); one exact multiply. Matches
    ggml's `y = (float)(q - 1) * d`."""
    codes = codes_tq2_0(b).view(np.int8) - np.int8(1)
    np.multiply(codes, _scale(b, 64), out=out, dtype=_F32)


def values_q1_0(b: np.ndarray, out: np.ndarray) -> None:
    """q1_0: `w = bit ? d : -d`; a selection and a negation (which flips the sign bit of any d,
    NaN included), no rounding. Matches ggml's `y = bit ? d : neg_d`."""
    scale = _scale(b, 0)
    np.copyto(out, np.where(bits_q1_0(b).astype(bool), scale, -scale))


def quantize_q1_0(weights: np.ndarray) -> np.ndarray:
    """q1_0 blocks [N, K / 128 * 18] of float32 weights [N, K] (K a multiple of 128): per 128
    weights d = mean |w| as float16, and one bit per weight, set where w >= 0. (gguf has no
    q1_0 quantizer; this one is for tests and benchmarks.)"""
    rows, depth = weights.shape
    blocks = np.asarray(weights, np.float32).reshape(rows * depth // 128, 128)
    scale = np.abs(blocks).mean(axis=1).astype("<f2").view(np.uint8).reshape(-1, 2)
    signs = np.packbits(blocks >= 0, axis=1, bitorder="little")
    return np.concatenate([scale, signs], axis=1).reshape(rows, -1)


def _per_32(scale: np.ndarray, block_size: int) -> np.ndarray:
    return np.repeat(scale, block_size // 32, axis=1)


def fields_tq1_0(b: np.ndarray) -> tuple:
    return codes_tq1_0(b), _per_32(_scale(b, 52), 256), None, 32, 1


def fields_tq2_0(b: np.ndarray) -> tuple:
    return codes_tq2_0(b), _per_32(_scale(b, 64), 256), None, 32, 1


def fields_q1_0(b: np.ndarray) -> tuple:
    return bits_q1_0(b) * np.uint8(2), _per_32(_scale(b, 0), 128), None, 32, 1
