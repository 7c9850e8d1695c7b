"""Exact float32 dequantization of GGUF block-quantized rows, in pure numpy.

Invariant: every function here returns exactly the float32 values its blocks encode, computed
with the float32 operations of ggml's reference C dequantizers (ggml-quants.c,
`dequantize_row_*`) in the same order, each one IEEE float32 operation rounded to nearest-even.
Float16 fields widen to float32 exactly and integer codes are exact. Every product formed (an
f16 scale, 11 significant bits, times one or two integers with at most 12 significant bits
between them) has at most 23 significant bits and neither overflows nor underflows, so it is
exact in float32: the one rounding anywhere is the final add or subtract of the min term in
q4_1, q5_1, q2_k, q4_k and q5_k. Each weight is therefore the exact value its block encodes,
rounded once to float32 (exact outright in the formats without a min): bit for bit what ggml's
reference code gives, with or without fused multiply-adds, on every platform.

Each format has two block functions here, which its row in table.py names (the row holds its
block size and bytes; nothing here repeats them): `values_<format>(blocks, out)` fills
out [n, block size] float32 with the weights of blocks [n, block bytes] uint8, and
`fields_<format>(blocks)` gives the codes and parameters those weights are built from
(BlockFields). `dequantize_rows` and `block_fields` check whole rows of blocks against a
layout and run them. All multi-byte fields are little-endian; "f16" is an IEEE half; byte
offsets are within a block.

Block layouts (32-weight blocks; weight j of the block is element j of the output):

q8_0 (34 B): d f16 @0, qs int8[32] @2. Weight j is qs[j].
q4_0 (18 B): d f16 @0, qs[16] @2. Weights 0..15 are the low nibbles of qs[0..15], weights
    16..31 the high nibbles; each code is the nibble minus 8.
q4_1 (20 B): d f16 @0, m f16 @2, qs[16] @4. Nibbles as in q4_0, unsigned (0..15).
q5_0 (22 B): d f16 @0, qh uint32 @2, qs[16] @6. Low 4 bits as in q4_0; bit j of qh is bit 4 of
    weight j's code; the code is the 5-bit value minus 16.
q5_1 (24 B): d f16 @0, m f16 @2, qh uint32 @4, qs[16] @8. As q5_0, unsigned (0..31).

Super-block layouts (QK_K = 256 weights; "half" h = weight // 128):

q2_k (84 B): scales[16] @0, qs[64] @16, d f16 @80, dmin f16 @82. Weight 128h + 32j + l (j < 4,
    l < 32) is bits 2j..2j+1 of qs[32h + l]; sub-block s = weight // 16 (16 weights) has scale
    scales[s] & 0xF and min scales[s] >> 4.
q3_k (110 B): hmask[32] @0, qs[64] @32, scales[12] @96, d f16 @108. Low 2 bits as in q2_k; bit
    4h + j of hmask[l] set means code = low, clear means code = low - 4. Sub-block s (16 weights)
    has the 6-bit scale ((scales[s % 8] >> 4 * (s // 8)) & 0xF) |
    (((scales[8 + s % 4] >> 2 * (s // 4)) & 3) << 4), used as scale - 32.
q4_k (144 B): d f16 @0, dmin f16 @2, scales[12] @4, qs[128] @16. Sub-block b = weight // 32 (32
    weights, l = weight % 32) has codes qs[32 * (b // 2) + l] & 0xF for even b, >> 4 for odd b.
    Its 6-bit scale and min: for b < 4, scales[b] & 63 and scales[b + 4] & 63; for b >= 4,
    (scales[b + 4] & 0xF) | (scales[b - 4] >> 6) << 4 and (scales[b + 4] >> 4) | (scales[b] >> 6)
    << 4 (the top 2 bits of bytes 0..7 carry the high bits of sub-blocks 4..7).
q5_k (176 B): d f16 @0, dmin f16 @2, scales[12] @4, qh[32] @16, qs[128] @48. Low 4 bits, 6-bit
    scales and mins as in q4_k; bit b of qh[l] is bit 4 of the code of weight 32b + l.
q6_k (210 B): ql[128] @0, qh[64] @128, scales int8[16] @192, d f16 @208. Weight 128h + 32j + l
    (j < 4) has low 4 bits from ql[64h + 32 * (j % 2) + l] (low nibble for j < 2, high for j >= 2)
    and high 2 bits from bits 2j..2j+1 of qh[32h + l]; code = 6-bit value - 32. Sub-block
    s = weight // 16 has scale scales[s].
"""

from collections.abc import Callable

import numpy as np

QK_K = 256

_F32 = np.float32

# Blocks are worked through in slabs of this many weights, so that the uint8 temporaries stay
# small and cache-resident whatever the size of the tensor; within a slab every step is one
# vectorised numpy operation over all of its blocks.
_SLAB_WEIGHTS = 1 << 18


def _blocks(data: np.ndarray, depth: int, name: str, block_size: int,
            block_bytes: int) -> tuple[np.ndarray, int]:
    """Check `data` and `depth` against the layout; return (blocks [n, block_bytes], rows)."""
    if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)):
        raise ValueError(f"{name}: depth must be an int, got {depth!r}")
    depth = int(depth)
    if depth <= 0 or depth % block_size:
        raise ValueError(
            f"{name}: depth {depth} is not a positive multiple of the block size {block_size}")
    data = np.asarray(data)
    if data.dtype != np.uint8:
        raise ValueError(f"{name}: data must be uint8, got {data.dtype}")
    expected = depth // block_size * block_bytes
    if data.ndim != 2 or data.shape[1] != expected:
        raise ValueError(
            f"{name}: data must have shape [rows, {expected}] (row_bytes = {depth} / {block_size}"
            f" * {block_bytes}) for depth {depth}, got shape {list(data.shape)}")
    rows = data.shape[0]
    return data.reshape(rows * (depth // block_size), block_bytes), rows


def dequantize_rows(data: np.ndarray, depth: int, name: str, block_size: int, block_bytes: int,
                    values: Callable[[np.ndarray, np.ndarray], None]) -> np.ndarray:
    """float32 [rows, depth] from uint8 rows [rows, depth / block_size * block_bytes] of whole
    blocks, `values(blocks, out)` filling the weights slab by slab; ValueError naming `name`
    and the expected row bytes when the rows do not fit the layout."""
    blocks, rows = _blocks(data, depth, name, block_size, block_bytes)
    n = blocks.shape[0]
    out = np.empty((n, block_size), dtype=_F32)
    step = _SLAB_WEIGHTS // block_size
    # Non-finite f16 fields give the IEEE results ggml gives (inf * 0 = nan), without warnings.
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, n, step):
            values(blocks[start:start + step], out[start:start + step])
    return out.reshape(rows, depth)


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian float16 field at `offset` of every block, widened exactly: [n, 1] f32."""
    return blocks[:, offset:offset + 2].copy().view("<f2").astype(_F32)


def _move(src: np.ndarray, frm: int, to: int, out: np.ndarray) -> None:
    """out = src with bit `frm` moved to bit `to` (other bits moved alike; the caller masks).

    Left moves are uint8 multiplies (they wrap like shifts), which numpy vectorises where it
    does not vectorise uint8 left shifts.
    """
    if to > frm:
        np.multiply(src, 1 << (to - frm), out=out)
    elif to < frm:
        np.right_shift(src, frm - to, out=out)
    else:
        np.copyto(out, src)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., m] packed bytes -> [..., 2, m] uint8: the low nibbles, then the high nibbles."""
    out = np.empty(qs.shape[:-1] + (2, qs.shape[-1]), dtype=np.uint8)
    np.bitwise_and(qs, 0x0F, out=out[..., 0, :])
    np.right_shift(qs, 4, out=out[..., 1, :])
    return out


def _crumbs(qs: np.ndarray, at: int = 0) -> np.ndarray:
    """[..., m] bytes -> [..., 4, m] uint8 whose [..., j, l] is bits 2j..2j+1 of qs[..., l],
    placed at bits at..at+1."""
    out = np.empty(qs.shape[:-1] + (4, qs.shape[-1]), dtype=np.uint8)
    for j in range(4):
        _move(qs, 2 * j, at, out[..., j, :])
    out &= 3 << at
    return out


def _bits(mask: np.ndarray, at: int) -> np.ndarray:
    """[n, m] bytes -> [n, 8, m] uint8 whose [:, b, l] is bit b of mask[:, l], placed at bit at."""
    out = np.empty((mask.shape[0], 8, mask.shape[1]), dtype=np.uint8)
    for b in range(8):
        _move(mask, b, at, out[:, b, :])
    out &= 1 << at
    return out


def _k4_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed bytes of q4_k/q5_k -> (scales, mins), each [n, 8] uint8 with 6-bit values."""
    s0, s1, s2 = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([s0 & 63, (s2 & 0x0F) | ((s0 >> 6) * 16)], axis=1)
    mn = np.concatenate([s1 & 63, (s2 >> 4) | ((s1 >> 6) * 16)], axis=1)
    return sc, mn


def values_q8_0(b: np.ndarray, out: np.ndarray) -> None:
    """q8_0: `w = q * d`, q the int8 code and d the block's f16 scale.

    float32 order: one multiply, exact (at most 18 significant bits). Matches ggml's
    `y = x[i].qs[j]*d`.
    """
    np.multiply(b[:, 2:].view(np.int8), _f16(b, 0), out=out, dtype=_F32)


def values_q4_0(b: np.ndarray, out: np.ndarray) -> None:
    """q4_0: `w = (nibble - 8) * d`.

    float32 order: the code nibble - 8 in integers, then one multiply, exact. Matches ggml's
    `y = x0*d` with `x0 = (qs[j] & 0x0F) - 8`.
    """
    q = _nibbles(b[:, 2:18]).reshape(-1, 32)
    q -= 8  # wraps in uint8; read back as int8 it is nibble - 8, in [-8, 7]
    np.multiply(q.view(np.int8), _f16(b, 0), out=out, dtype=_F32)


def values_q4_1(b: np.ndarray, out: np.ndarray) -> None:
    """q4_1: `w = (q * d) + m`, q the nibble in [0, 15], m the block's f16 min.

    float32 order: q * d (exact), then + m, the one rounding. Matches ggml's `y = x0*d + m`.
    """
    q = _nibbles(b[:, 4:20]).reshape(-1, 32)
    np.multiply(q, _f16(b, 0), out=out, dtype=_F32)
    out += _f16(b, 2)


def _five_bit(b: np.ndarray, qh_at: int, qs_at: int) -> np.ndarray:
    """The 5-bit codes of q5_0/q5_1 blocks, [n, 32] uint8 in [0, 31]."""
    q = _nibbles(b[:, qs_at:qs_at + 16]).reshape(-1, 32)
    high = np.unpackbits(b[:, qh_at:qh_at + 4], axis=1, bitorder="little")
    high *= 16
    q |= high
    return q


def values_q5_0(b: np.ndarray, out: np.ndarray) -> None:
    """q5_0: `w = (q5 - 16) * d`, q5 the 5-bit code.

    float32 order: q5 - 16 in integers, then one multiply, exact. Matches ggml's `y = x0*d`
    with `x0 = ((qs[j] & 0x0F) | xh_0) - 16`.
    """
    q = _five_bit(b, 2, 6)
    q -= 16  # wraps in uint8; read back as int8 it is the 5-bit code - 16, in [-16, 15]
    np.multiply(q.view(np.int8), _f16(b, 0), out=out, dtype=_F32)


def values_q5_1(b: np.ndarray, out: np.ndarray) -> None:
    """q5_1: `w = (q5 * d) + m`, q5 the 5-bit code in [0, 31], m the block's f16 min.

    float32 order: q5 * d (exact), then + m, the one rounding. Matches ggml's `y = x0*d + m`.
    """
    np.multiply(_five_bit(b, 4, 8), _f16(b, 0), out=out, dtype=_F32)
    out += _f16(b, 2)


def values_q2_k(b: np.ndarray, out: np.ndarray) -> None:
    """q2_k: `w = (d * sc) * q - (dmin * mn)` per 16-weight sub-block, sc = scales[s] & 0xF,
    mn = scales[s] >> 4, q in [0, 3].

    float32 order: dl = d * sc and ml = dmin * mn first, then dl * q, then dl * q - ml; the
    products are exact, the subtraction is the one rounding. Matches ggml's
    `dl = d * (sc & 0xF); ml = min * (sc >> 4); y = dl * q - ml`.
    """
    n = b.shape[0]
    scales = b[:, 0:16]
    dl = _f16(b, 80) * (scales & 0x0F).astype(_F32)
    ml = _f16(b, 82) * (scales >> 4).astype(_F32)
    q = _crumbs(b[:, 16:80].reshape(n, 2, 32)).reshape(n, 16, 16)
    o = out.reshape(n, 16, 16)
    np.multiply(dl[:, :, None], q, out=o, dtype=_F32)
    o -= ml[:, :, None]


def _q3_k_parts(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q3_k blocks -> (d * (sc - 32) float32 [n, 16], the 3-bit codes 0..7 uint8 [n, 8, 32])."""
    n = b.shape[0]
    packed = b[:, 96:108]
    low = _nibbles(packed[:, 0:8]).reshape(n, 16)
    low |= _crumbs(packed[:, 8:12], at=4).reshape(n, 16)
    dl = _f16(b, 108) * (low.view(np.int8) - np.int8(32)).astype(_F32)
    q = _crumbs(b[:, 32:96].reshape(n, 2, 32)).reshape(n, 8, 32)
    q |= _bits(b[:, 0:32], at=2)
    return dl, q


def values_q3_k(b: np.ndarray, out: np.ndarray) -> None:
    """q3_k: `w = (d * (sc - 32)) * q` per 16-weight sub-block, sc its 6-bit scale, q the 3-bit
    code in [-4, 3] (the low 2 bits, minus 4 where the hmask bit is clear).

    float32 order: dl = d * (sc - 32) first (sc - 32 in integers), then dl * q; both products
    exact. Matches ggml's `dl = d_all * (scales[is] - 32); y = dl * (q - ((hm[l] & m) ? 0 : 4))`.
    """
    n = b.shape[0]
    dl, q = _q3_k_parts(b)
    q -= 4  # wraps in uint8; read back as int8 it is the 3-bit code - 4, in [-4, 3]
    np.multiply(dl[:, :, None], q.reshape(n, 16, 16).view(np.int8), out=out.reshape(n, 16, 16),
                dtype=_F32)


def _k4_finish(b: np.ndarray, q: np.ndarray, out: np.ndarray) -> None:
    """out = (d * sc) * q - (dmin * mn) for q4_k/q5_k blocks and their [n, 8, 32] codes."""
    n = b.shape[0]
    sc, mn = _k4_scales(b[:, 4:16])
    dsc = _f16(b, 0) * sc.astype(_F32)
    dmn = _f16(b, 2) * mn.astype(_F32)
    o = out.reshape(n, 8, 32)
    np.multiply(dsc[:, :, None], q, out=o, dtype=_F32)
    o -= dmn[:, :, None]


def values_q4_k(b: np.ndarray, out: np.ndarray) -> None:
    """q4_k: `w = (d * sc) * q - (dmin * mn)` per 32-weight sub-block, sc and mn its 6-bit scale
    and min, q the nibble in [0, 15].

    float32 order: d1 = d * sc and m1 = dmin * mn first, then d1 * q, then d1 * q - m1; the
    products are exact, the subtraction is the one rounding. Matches ggml's
    `d1 = d * sc; m1 = min * m; y = d1 * (q[l] & 0xF) - m1`.
    """
    n = b.shape[0]
    _k4_finish(b, _nibbles(b[:, 16:144].reshape(n, 4, 32)).reshape(n, 8, 32), out)


def values_q5_k(b: np.ndarray, out: np.ndarray) -> None:
    """q5_k: `w = (d * sc) * q - (dmin * mn)` per 32-weight sub-block, sc and mn its 6-bit scale
    and min, q the 5-bit code in [0, 31].

    float32 order: d1 = d * sc and m1 = dmin * mn first, then d1 * q, then d1 * q - m1; the
    products are exact, the subtraction is the one rounding. Matches ggml's
    `y = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1`.
    """
    n = b.shape[0]
    q = _nibbles(b[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32)
    q |= _bits(b[:, 16:48], at=4)
    _k4_finish(b, q, out)


def values_q6_k(b: np.ndarray, out: np.ndarray) -> None:
    """q6_k: `w = (d * sc) * q` per 16-weight sub-block, sc its int8 scale, q the 6-bit code
    minus 32, in [-32, 31].

    float32 order: d * sc first, then (d * sc) * q; both products exact (at most 23 significant
    bits). Matches ggml's `y = d * sc[is] * q1`, which C evaluates left to right.
    """
    n = b.shape[0]
    dsc = _f16(b, 208) * b[:, 192:208].view(np.int8).astype(_F32)
    ql = b[:, 0:128].reshape(n, 2, 2, 32)  # [n, h, j % 2, l]
    q = np.empty((n, 2, 4, 32), dtype=np.uint8)  # [n, h, j, l]: weight 128h + 32j + l
    np.bitwise_and(ql, 0x0F, out=q[:, :, 0:2])
    np.right_shift(ql, 4, out=q[:, :, 2:4])
    q |= _crumbs(b[:, 128:192].reshape(n, 2, 32), at=4)
    q -= 32  # wraps in uint8; read back as int8 it is the 6-bit code - 32, in [-32, 31]
    np.multiply(dsc[:, :, None], q.reshape(n, 16, 16).view(np.int8), out=out.reshape(n, 16, 16),
                dtype=_F32)


class BlockFields:
    """A block-quantized matrix as unsigned integer codes and per-group float32 parameters:
    weight k of a row is `scales[g] * (codes[k] - offset) + minimums[g]` with g = k // group
    (minimums None: 0), each value exactly the float32 product or sum ggml forms, so rebuilding
    the weights this way gives dequantize's bits."""

    def __init__(self, codes: np.ndarray, scales: np.ndarray, minimums: np.ndarray | None,
                 group: int, offset: int) -> None:
        self.codes, self.scales, self.minimums = codes, scales, minimums
        self.group, self.offset = group, offset

    def weights(self) -> np.ndarray:
        rows, depth = self.codes.shape
        shaped = (rows, depth // self.group, self.group)
        signed = (self.codes.astype(np.int16) - self.offset).reshape(shaped)
        values = self.scales[..., None] * signed.astype(_F32)
        if self.minimums is not None:
            values = values + self.minimums[..., None]
        return values.reshape(rows, depth)


def fields_q8_0(b: np.ndarray) -> tuple:
    return b[:, 2:34] ^ np.uint8(0x80), _f16(b, 0), None, 32, 128


def _fields_q4(b: np.ndarray, minimum: bool) -> tuple:
    start = 4 if minimum else 2
    codes = _nibbles(b[:, start:start + 16]).reshape(-1, 32)
    return codes, _f16(b, 0), _f16(b, 2) if minimum else None, 32, 0 if minimum else 8


def fields_q4_0(b: np.ndarray) -> tuple:
    return _fields_q4(b, minimum=False)


def fields_q4_1(b: np.ndarray) -> tuple:
    return _fields_q4(b, minimum=True)


def _fields_q5(b: np.ndarray, minimum: bool) -> tuple:
    codes = _five_bit(b, 4, 8) if minimum else _five_bit(b, 2, 6)
    return codes, _f16(b, 0), _f16(b, 2) if minimum else None, 32, 0 if minimum else 16


def fields_q5_0(b: np.ndarray) -> tuple:
    return _fields_q5(b, minimum=False)


def fields_q5_1(b: np.ndarray) -> tuple:
    return _fields_q5(b, minimum=True)


def _fields_k4(b: np.ndarray, five: bool) -> tuple:
    n = b.shape[0]
    sc, mn = _k4_scales(b[:, 4:16])
    if five:
        codes = _nibbles(b[:, 48:176].reshape(n, 4, 32)).reshape(n, 8, 32)
        codes |= _bits(b[:, 16:48], at=4)
    else:
        codes = _nibbles(b[:, 16:144].reshape(n, 4, 32)).reshape(n, 8, 32)
    scales = _f16(b, 0) * sc.astype(_F32)
    minimums = -(_f16(b, 2) * mn.astype(_F32))
    return codes.reshape(n, 256), scales, minimums, 32, 0


def fields_q4_k(b: np.ndarray) -> tuple:
    return _fields_k4(b, five=False)


def fields_q5_k(b: np.ndarray) -> tuple:
    return _fields_k4(b, five=True)


def fields_q6_k(b: np.ndarray) -> tuple:
    n = b.shape[0]
    scales = _f16(b, 208) * b[:, 192:208].view(np.int8).astype(_F32)
    ql = b[:, 0:128].reshape(n, 2, 2, 32)
    codes = np.empty((n, 2, 4, 32), dtype=np.uint8)
    np.bitwise_and(ql, 0x0F, out=codes[:, :, 0:2])
    np.right_shift(ql, 4, out=codes[:, :, 2:4])
    codes |= _crumbs(b[:, 128:192].reshape(n, 2, 32), at=4)
    return codes.reshape(n, 256), scales, None, 16, 32


def fields_q2_k(b: np.ndarray) -> tuple:
    n = b.shape[0]
    scales = b[:, 0:16]
    dl = _f16(b, 80) * (scales & 0x0F).astype(_F32)
    minimums = -(_f16(b, 82) * (scales >> 4).astype(_F32))
    codes = _crumbs(b[:, 16:80].reshape(n, 2, 32)).reshape(n, 256)
    return codes, dl, minimums, 16, 0


def fields_q3_k(b: np.ndarray) -> tuple:
    scales, codes = _q3_k_parts(b)
    return codes.reshape(b.shape[0], 256), scales, None, 16, 4


def block_fields(data: np.ndarray, depth: int, name: str, block_size: int, block_bytes: int,
                 fields: Callable[[np.ndarray], tuple]) -> BlockFields:
    """The codes and parameters (BlockFields) of whole rows of blocks, `fields(blocks)` giving
    (codes, scales, minimums or None, group, offset); q8_0's int8 codes come as code + 128."""
    blocks, rows = _blocks(data, depth, name, block_size, block_bytes)
    with np.errstate(invalid="ignore", over="ignore"):
        codes, scales, minimums, group, offset = fields(blocks)
    groups = depth // group
    return BlockFields(np.ascontiguousarray(codes).reshape(rows, depth),
                       scales.reshape(rows, groups),
                       None if minimums is None else minimums.reshape(rows, groups), group,
                       offset)
