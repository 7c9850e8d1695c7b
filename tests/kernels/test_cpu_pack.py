"""The dot layout's packing (csrc/cpu/pack_dot.c) against a numpy packing built on the
format row's block_fields (exactdraft/formats/table.py), byte for byte, for every format with a dot
kernel."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.formats import FORMATS
from exactdraft.kernels import cpu
from tests.kernels.test_cpu_lookup import LOOKUP_FORMATS, lookup_records
from tests.kernels.test_cpu_quantized import (
    BLOCK_FORMATS,
    K_LOW_FORMATS,
    k_low_parameters,
    quantized_weight,
)

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

DOT_GROUP = 16
NIBBLE_FORMATS = ("q4_0", "q4_1", "q4_k")
SHARED = ("tq1_0", "tq2_0", "q1_0")  # one record's scales shared by its blocks of 32


def shared_records(weight) -> np.ndarray:
    """The ternary and 1-bit formats' records (dot_record.h): per group of 16 rows and GGUF
    block, the 16 float16 scales, then the codes: tq1_0's 52 bytes of trits as stored, 4 bytes
    of each row per chunk; per block of 32, 2-bit fields (tq2_0: two chunks, bits 2s..2s+1 of a
    row's byte i in chunk t hold code 8s+4t+i) or bits (q1_0: one chunk, bit s of a row's byte i
    holds the bit of code 4s+i)."""
    fields = weight.row.block_fields(weight.data, weight.shape[1])
    count, depth = weight.shape
    per_block = weight.row.block_size // 32
    blocks, groups = depth // weight.row.block_size, -(-count // DOT_GROUP)
    scales = np.zeros((groups * DOT_GROUP, blocks), np.float16)
    scales[:count] = fields.scales[:, ::per_block]
    codes = np.zeros((groups * DOT_GROUP, blocks, per_block, 32), np.uint8)
    codes[:count] = fields.codes.reshape(count, blocks, per_block, 32)
    if weight.format == "tq1_0":
        stored = np.zeros((groups * DOT_GROUP, blocks, 54), np.uint8)
        stored[:count] = weight.data.reshape(count, blocks, 54)
        chunks = stored[..., :52].reshape(groups * DOT_GROUP, blocks, 1, 13, 4)
    elif weight.format == "q1_0":
        bits = (codes // 2).reshape(*codes.shape[:3], 8, 4)  # [..., s, i]
        packed = np.bitwise_or.reduce(bits << np.arange(8, dtype=np.uint8)[:, None], axis=-2)
        chunks = packed[..., None, :]  # [.., chunk 0, byte i]
    else:
        crumbs = codes.reshape(*codes.shape[:3], 4, 2, 4)  # [..., s, t, i]
        shifts = (2 * np.arange(4, dtype=np.uint8))[:, None, None]
        chunks = np.bitwise_or.reduce(crumbs << shifts, axis=-3)  # [..., t, i]
    by_group = chunks.reshape(groups, DOT_GROUP, blocks, chunks.shape[2], -1, 4)
    code_bytes = by_group.transpose(0, 2, 3, 4, 1, 5).reshape(groups, blocks, -1)
    scale_bytes = scales.reshape(groups, DOT_GROUP, blocks).transpose(0, 2, 1)
    scale_bytes = np.ascontiguousarray(scale_bytes).view(np.uint8)
    return np.concatenate([scale_bytes, code_bytes], axis=-1).reshape(groups, -1)


NARROW = ("q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "iq4_xs")  # dot_layout.h's narrow records
SUPER_HEADER = ("q4_k", "q5_k", "q6_k", "iq4_xs")


def numpy_records(weight) -> np.ndarray:
    """kernels.h's dot layout from the block fields: per group of 16 rows and block of 32, the
    float16 parameters then the codes in 64-byte chunks."""
    if weight.format in K_LOW_FORMATS:
        return k_low_numpy_records(weight)
    if weight.format in NARROW:
        return narrow_records(weight)
    if weight.format in LOOKUP_FORMATS:
        return lookup_records(weight)
    fields = weight.row.block_fields(weight.data, weight.shape[1])
    count, depth = weight.shape
    blocks, groups = depth // 32, -(-count // DOT_GROUP)
    parameters = [fields.scales] + ([] if fields.minimums is None else [fields.minimums])
    codes = fields.codes.reshape(count, blocks, 32)
    if weight.format in NIBBLE_FORMATS:
        codes = codes[..., :16] | (codes[..., 16:] << np.uint8(4))
    parts = []
    for part in parameters:
        padded = np.zeros((groups * DOT_GROUP, blocks), np.float16)
        padded[:count] = part
        by_block = padded.reshape(groups, DOT_GROUP, blocks).transpose(0, 2, 1)
        parts.append(np.ascontiguousarray(by_block).view(np.uint8))
    padded = np.zeros((groups * DOT_GROUP, blocks, codes.shape[-1]), np.uint8)
    padded[:count] = codes
    parts.append(padded.reshape(groups, DOT_GROUP, blocks, -1, 4).transpose(0, 2, 3, 1, 4)
                 .reshape(groups, blocks, -1))
    return np.concatenate(parts, axis=-1).reshape(groups, -1)


def code_chunks(format: str, codes: np.ndarray) -> np.ndarray:
    """uint8 codes [rows, blocks, 32] -> [rows, blocks, chunks, 4]: the low 4 bits as q4_0's
    nibble chunks (chunk t, byte i: codes 4t+i and 16+4t+i), then q5's chunk of high bits (bit j
    of byte i: bit 4 of code 4j+i) or q6_k's two of 2-bit fields (chunk p, byte i, bits 2t:
    bits 4..5 of code 4(4p+t)+i)."""
    rows, blocks = codes.shape[:2]
    nibbles = (codes[..., :16] & 15) | ((codes[..., 16:] & 15) << 4)
    chunks = [nibbles.reshape(rows, blocks, 4, 4)]
    if format == "q6_k":
        top = ((codes >> 4) & 3).reshape(rows, blocks, 2, 4, 4)  # [.., p, t, i]
        shifts = (2 * np.arange(4, dtype=np.uint8))[:, None]
        chunks.append(np.bitwise_or.reduce(top << shifts, axis=3))
    elif format != "iq4_xs" and format != "q4_k":
        bits = ((codes >> 4) & 1).reshape(rows, blocks, 8, 4)  # [.., j, i]
        shifts = np.arange(8, dtype=np.uint8)[:, None]
        chunks.append(np.bitwise_or.reduce(bits << shifts, axis=2)[:, :, None])
    return np.concatenate(chunks, axis=2).astype(np.uint8)


def narrow_parameters(weight) -> tuple[np.ndarray, np.ndarray]:
    """From the raw blocks: the float16 bits a record (or a super-block header) holds per row,
    uint16 [rows, blocks or super-blocks, 1 or 2] (q4_k, q5_k: d, -dmin), and the int8
    sub-scales per block of 32, [rows, blocks, 0..2] (q4_k, q5_k: sc, m; q6_k: sc of its
    halves; iq4_xs: ls - 32)."""
    row = weight.row
    count, depth = weight.shape
    raw = weight.data.reshape(count, depth // row.block_size, row.block_bytes)
    halves = raw.copy().view("<u2")  # [rows, blocks, block bytes / 2]
    if weight.format in ("q5_0", "q5_1"):
        return halves[..., :1 + (weight.format == "q5_1")], np.zeros((count, depth // 32, 0))
    if weight.format == "q6_k":
        scales = raw[..., 192:208].view(np.int8).reshape(count, -1, 2)
        return halves[..., 104:105], scales
    if weight.format == "iq4_xs":
        high = halves[..., 1:2].astype(np.int64)
        low = np.stack([raw[..., 4:8] & 15, raw[..., 4:8] >> 4], -1).reshape(count, -1, 8)
        ls = low | (((high >> (2 * np.arange(8))) & 3) << 4)
        return halves[..., :1], (ls - 32).astype(np.int8).reshape(count, -1, 1)
    packed = raw[..., 4:16].astype(np.int64)
    j = np.arange(8)
    low_j, high_j = np.minimum(j, 3), np.maximum(j - 4, 0)
    scale = np.where(j < 4, packed[..., low_j] & 63,
                     (packed[..., high_j + 8] & 15) | ((packed[..., high_j] >> 6) << 4))
    minimum = np.where(j < 4, packed[..., low_j + 4] & 63,
                       (packed[..., high_j + 8] >> 4) | ((packed[..., high_j + 4] >> 6) << 4))
    header = halves[..., :2] ^ np.array([0, 0x8000], np.uint16)
    return header, np.stack([scale, minimum], -1).astype(np.int8).reshape(count, -1, 2)


def narrow_records(weight) -> np.ndarray:
    """dot_layout.h's records of q5_0, q5_1 (per block of 32: float16 d (and m), then the code
    chunks) and of the super-block formats (per 256 weights: the header's 16 d (and 16 -dmin),
    then per block of 32 the 16 rows' sub-scales, one byte each, then the code chunks)."""
    count, depth = weight.shape
    groups = -(-count // DOT_GROUP)
    if weight.format == "iq4_xs":  # its stored nibbles, which index the table
        raw = weight.data.reshape(count, depth // 256, 136)[..., 8:].reshape(count, -1, 16)
        codes = np.concatenate([raw & 15, raw >> 4], -1)
    else:
        codes = weight.row.block_fields(weight.data, depth).codes.reshape(count, -1, 32)
    chunks = _by_group(code_chunks(weight.format, codes), groups)  # [g, blocks, chunks, 4, 16]
    code_bytes = np.swapaxes(chunks, -1, -2).reshape(groups, depth // 32, -1)
    halves, sub_scales = narrow_parameters(weight)
    parameter_bytes = np.ascontiguousarray(_by_group(halves, groups)).view(np.uint8)
    parameter_bytes = parameter_bytes.reshape(groups, halves.shape[1], -1)
    if weight.format not in SUPER_HEADER:
        return np.concatenate([parameter_bytes, code_bytes], -1).reshape(groups, -1)
    sub_bytes = _by_group(sub_scales, groups).view(np.uint8).reshape(groups, depth // 32, -1)
    blocks = np.concatenate([sub_bytes, code_bytes], -1).reshape(groups, depth // 256, -1)
    return np.concatenate([parameter_bytes, blocks], -1).reshape(groups, -1)


def _by_group(values: np.ndarray, groups: int) -> np.ndarray:
    """[count, supers, ...] -> [groups, supers, ..., 16 rows] zero-padded, as the records
    interleave their rows innermost."""
    padded = np.zeros((groups * DOT_GROUP,) + values.shape[1:], values.dtype)
    padded[:values.shape[0]] = values
    shaped = padded.reshape((groups, DOT_GROUP) + values.shape[1:])
    return np.moveaxis(shaped, 1, -1)


def k_low_numpy_records(weight) -> np.ndarray:
    """q2_k / q3_k's super-block records (csrc/cpu/dot_k_low.h) from the block fields and the
    sub-scales: per group and 256 weights a header (16 float16 d; q2_k then 16 -dmin), then per
    block of 32 the rows' sub-scales (q2_k: sc0 | sc1 << 4, then m0 | m1 << 4; q3_k: int8 s0,
    then s1) and chunks of 4 codes per row: 2-bit chunk p has code 4 (4p + t) + i at bits 2t of
    byte i, q3_k's high chunk its bit 2 at bit t of byte i for t = 0..7."""
    count, depth = weight.shape
    supers, groups = depth // 256, -(-count // DOT_GROUP)
    d, second, sub_scales, sub_minimums = k_low_parameters(weight)
    header = [d.astype(np.float16).view(np.uint16)]
    if weight.format == "q2_k":
        header.append(second.astype(np.float16).view(np.uint16))
        pairs = sub_scales.reshape(count, supers, 8, 2)
        minimum_pairs = sub_minimums.reshape(count, supers, 8, 2)
        scales = np.stack([pairs[..., 0] | pairs[..., 1] << 4,
                           minimum_pairs[..., 0] | minimum_pairs[..., 1] << 4], -1)
        scales = scales.astype(np.uint8)
    else:
        scales = sub_scales.reshape(count, supers, 8, 2).astype(np.int8).view(np.uint8)
    scales = _by_group(scales, groups)  # [g, s, 8, 2, 16]
    header_bytes = np.concatenate([_by_group(np.stack(header, -1), groups)[:, :, h]
                                   for h in range(len(header))], -1)
    header_bytes = np.ascontiguousarray(header_bytes).view(np.uint8)
    fields = weight.row.block_fields(weight.data, depth)
    codes = fields.codes.reshape(count, supers, 8, 8, 4).astype(np.uint8)  # block, chunk, i
    low = (codes & 3).reshape(count, supers, 8, 2, 4, 4)  # block, p, t, i
    shifts = (2 * np.arange(4, dtype=np.uint8))[:, None]
    chunks = [np.bitwise_or.reduce(low << shifts, axis=4)]  # [count, s, 8, 2, 4]
    if weight.format == "q3_k":
        high = (codes >> 2) & 1  # [count, s, 8, chunk t, i]
        bits = np.arange(8, dtype=np.uint8)[:, None]
        chunks.append(np.bitwise_or.reduce(high << bits, axis=3)[:, :, :, None])
    code_bytes = _by_group(np.concatenate(chunks, 3), groups)  # [g, s, 8, chunks, 4, 16]
    code_bytes = np.swapaxes(code_bytes, -1, -2)  # byte 4 row + i
    blocks = np.concatenate([scales.reshape(groups, supers, 8, -1),
                             code_bytes.reshape(groups, supers, 8, -1)], -1)
    return np.concatenate([header_bytes.reshape(groups, supers, -1),
                           blocks.reshape(groups, supers, -1)], -1).reshape(groups, -1)


@pytest.mark.parametrize("format", BLOCK_FORMATS)
@pytest.mark.parametrize("rows", [1, 16, 37])
def test_c_packing_equals_the_numpy_packing(format, rows):
    depth = 512
    weight = quantized_weight(format, rows, depth, np.random.default_rng(rows))
    packed = cpu.pack_matrix(weight, layout="dot")
    reference = shared_records if format in SHARED else numpy_records
    assert packed.data.tobytes() == reference(weight).tobytes()


@pytest.mark.parametrize("format", ["q6_k", "q5_0", "q4_k", *K_LOW_FORMATS])
def test_packing_sees_a_changed_block(format):
    """Negative control: one changed code byte changes the records."""
    weight = quantized_weight(format, 16, 256, np.random.default_rng(3))
    before = cpu.pack_matrix(weight, layout="dot").data.copy()
    weight.data[5, 7] ^= 0x01
    assert not np.array_equal(cpu.pack_matrix(weight, layout="dot").data, before)


def test_formats_without_a_float_kernel_refuse_other_layouts():
    weight = quantized_weight("q5_0", 16, 64, np.random.default_rng(4))
    with pytest.raises(ValueError, match="dot layout only"):
        cpu.pack_matrix(weight, layout="grouped")
    assert not FORMATS["q5_0"].float_kernel


@pytest.mark.parametrize("format", BLOCK_FORMATS)
def test_records_take_about_the_file_bytes(format):
    """Every block format's records hold its codes at their stored width: 48 rows of K = 1024
    take at most 4% more than their GGUF blocks (6-bit sub-scales kept as bytes: q3_k 3.6%,
    q4_k 2.8%, q5_k 2.3%); the same matrix dequantized for the float kernel takes 4x and more,
    which the bound would catch."""
    weight = quantized_weight(format, 48, 1024, np.random.default_rng(42))
    ratio = cpu.pack_matrix(weight, layout="dot").data.nbytes / weight.data.nbytes
    assert ratio <= 1.04, ratio
    float32 = cpu.pack_matrix(weight.dequantize()).data.nbytes / weight.data.nbytes
    assert float32 > 1.04
