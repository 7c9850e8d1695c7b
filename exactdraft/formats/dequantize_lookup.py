"""Exact float32 dequantization of the GGUF formats whose 4-bit codes index a 16-entry table
(iq4_nl, iq4_xs, mxfp4), in pure numpy: the twin of formats/dequantize.py for these formats.

Invariant: every function here returns exactly the float32 values its blocks encode, as ggml's
reference C dequantizers (ggml-quants.c, `dequantize_row_iq4_nl`, `dequantize_row_iq4_xs`,
`dequantize_row_mxfp4`) and gguf-py 0.19 compute them. Each weight is a table value (an integer
of at most 7 significant bits) times a block scale: an f16 d (11 significant bits), d times a
6-bit integer (at most 17 bits, exact), or a power of two 2^(e - 128). Every product therefore
has at most 24 significant bits and is exact in float32 whatever the order (mxfp4's products
overflow to inf only for e >= 253, as ggml's do), so no rounding occurs anywhere.

Block layouts (weight j of a 32-weight block or sub-block is element j of its output):

iq4_nl (18 B, 32 weights): d f16 @0, qs[16] @2. Weights 0..15 are IQ4_VALUES[low nibbles of
    qs[0..15]] * d, weights 16..31 IQ4_VALUES[high nibbles] * d.
iq4_xs (136 B, 256 weights): d f16 @0, scales_h uint16 @2, scales_l[4] @4, qs[128] @8.
    Sub-block b (32 weights) has the 6-bit scale ls = ((scales_l[b // 2] >> 4 (b % 2)) & 0xF)
    | (((scales_h >> 2b) & 3) << 4) and codes from qs[16b .. 16b + 15] as in iq4_nl; weight
    = (d * (ls - 32)) * IQ4_VALUES[code].
mxfp4 (17 B, 32 weights): e uint8 @0, qs[16] @1. Codes as in iq4_nl; weight =
    MXFP4_VALUES[code] * 2^(e - 128) (e2m1 values doubled, times half the e8m0 scale 2^(e - 127)).

The fields functions give a block's codes as the table value + 128 (unsigned), offset 128, with
one float32 scale per 32 weights, so that BlockFields rebuilds the weights exactly.
"""

import numpy as np

# ggml's kvalues_iq4nl and kvalues_mxfp4 (the OCP MX e2m1 values, doubled to integers).
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.int8)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)

_F32 = np.float32


def _nibble_codes(qs: np.ndarray) -> np.ndarray:
    """[n, ..., 16] packed bytes -> [n, ..., 32] uint8 codes: the low nibbles, then the high."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _d(b: np.ndarray) -> np.ndarray:
    """The f16 d at offset 0 of every block, widened exactly: [n, 1] float32."""
    return b[:, 0:2].copy().view("<f2").astype(_F32)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """2^(e - 128) as float32 for uint8 e (ggml's ggml_e8m0_to_fp32_half): 2^-128 and 2^-127
    are subnormal bit patterns, the rest have exponent field e - 1."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << np.uint32(23))
    return bits.astype(np.uint32).view(_F32)


def _iq4_xs_scales(b: np.ndarray) -> np.ndarray:
    """The 8 sub-block scales d * (ls - 32) of iq4_xs blocks, [n, 8] float32 (exact)."""
    high = b[:, 2:4].copy().view("<u2").astype(np.int32)  # [n, 1]
    low = _nibble_codes(b[:, 4:8]).reshape(-1, 2, 4).transpose(0, 2, 1).reshape(-1, 8)
    shifts = 2 * np.arange(8, dtype=np.int32)
    scale = low.astype(np.int32) | (((high >> shifts) & 3) << 4)
    return _d(b) * (scale - 32).astype(_F32)


def values_iq4_nl(b: np.ndarray, out: np.ndarray) -> None:
    """iq4_nl: `w = d * IQ4_VALUES[code]`, one exact product. Matches ggml's
    `y[j] = d * kvalues_iq4nl[qs[j] & 0xf]`."""
    np.multiply(_d(b), IQ4_VALUES[_nibble_codes(b[:, 2:18])], out=out, dtype=_F32)


def values_iq4_xs(b: np.ndarray, out: np.ndarray) -> None:
    """iq4_xs: `w = (d * (ls - 32)) * IQ4_VALUES[code]` per 32-weight sub-block; both products
    exact. Matches ggml's `dl = d * (ls - 32); y[j] = dl * kvalues_iq4nl[qs[j] & 0xf]`."""
    n = b.shape[0]
    codes = _nibble_codes(b[:, 8:136].reshape(n, 8, 16))
    np.multiply(_iq4_xs_scales(b)[:, :, None], IQ4_VALUES[codes], out=out.reshape(n, 8, 32),
                dtype=_F32)


def values_mxfp4(b: np.ndarray, out: np.ndarray) -> None:
    """mxfp4: `w = MXFP4_VALUES[code] * 2^(e - 128)`, one exact product (inf past float32's
    range, as in ggml). Matches ggml's `y[j] = kvalues_mxfp4[qs[j] & 0xf] * d`."""
    np.multiply(MXFP4_VALUES[_nibble_codes(b[:, 1:17])], e8m0_half(b[:, 0:1]), out=out,
                dtype=_F32)


def _lifted(values: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Table values + 128 as uint8 codes (offset 128)."""
    return (values[codes].astype(np.int16) + 128).astype(np.uint8)


def fields_iq4_nl(b: np.ndarray) -> tuple:
    return _lifted(IQ4_VALUES, _nibble_codes(b[:, 2:18])), _d(b), None, 32, 128


def fields_iq4_xs(b: np.ndarray) -> tuple:
    n = b.shape[0]
    codes = _lifted(IQ4_VALUES, _nibble_codes(b[:, 8:136].reshape(n, 8, 16)))
    return codes.reshape(n, 256), _iq4_xs_scales(b), None, 32, 128


def fields_mxfp4(b: np.ndarray) -> tuple:
    return _lifted(MXFP4_VALUES, _nibble_codes(b[:, 1:17])), e8m0_half(b[:, 0:1]), None, 32, 128
