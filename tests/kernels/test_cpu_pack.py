"""The dot layout's packing (csrc/cpu/pack_dot.c) against a numpy packing built on the
format row's block_fields (exactdraft/formats/table.py), byte for byte, for every format with a dot
kernel."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.formats import FORMATS
from exactdraft.kernels import cpu
from tests.kernels.test_cpu_quantized import BLOCK_FORMATS, quantized_weight

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

DOT_GROUP = 16
NIBBLE_FORMATS = ("q4_0", "q4_1", "q4_k")
FLOAT_PARAMETER_FORMATS = ("q4_k", "q5_k", "q6_k")
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


def numpy_records(weight) -> np.ndarray:
    """kernels.h's dot layout from the block fields: per group of 16 rows and block of 32, the
    parameters (float16, float32 for the k formats) then the codes in 64-byte chunks."""
    fields = weight.row.block_fields(weight.data, weight.shape[1])
    count, depth = weight.shape
    blocks, groups = depth // 32, -(-count // DOT_GROUP)
    if weight.format == "q6_k":
        halves = fields.scales.reshape(count, blocks, 2)
        parameters = [halves[..., 0], halves[..., 1]]
    else:
        parameters = [fields.scales] + ([] if fields.minimums is None else [fields.minimums])
    dtype = np.float32 if weight.format in FLOAT_PARAMETER_FORMATS else np.float16
    codes = fields.codes.reshape(count, blocks, 32)
    if weight.format in NIBBLE_FORMATS:
        codes = codes[..., :16] | (codes[..., 16:] << np.uint8(4))
    parts = []
    for part in parameters:
        padded = np.zeros((groups * DOT_GROUP, blocks), dtype)
        padded[:count] = part
        by_block = padded.reshape(groups, DOT_GROUP, blocks).transpose(0, 2, 1)
        parts.append(np.ascontiguousarray(by_block).view(np.uint8))
    padded = np.zeros((groups * DOT_GROUP, blocks, codes.shape[-1]), np.uint8)
    padded[:count] = codes
    parts.append(padded.reshape(groups, DOT_GROUP, blocks, -1, 4).transpose(0, 2, 3, 1, 4)
                 .reshape(groups, blocks, -1))
    return np.concatenate(parts, axis=-1).reshape(groups, -1)


@pytest.mark.parametrize("format", BLOCK_FORMATS)
@pytest.mark.parametrize("rows", [1, 16, 37])
def test_c_packing_equals_the_numpy_packing(format, rows):
    depth = 512
    weight = quantized_weight(format, rows, depth, np.random.default_rng(rows))
    packed = cpu.pack_matrix(weight, layout="dot")
    reference = shared_records if format in SHARED else numpy_records
    assert packed.data.tobytes() == reference(weight).tobytes()


def test_packing_sees_a_changed_block():
    """Negative control: one changed code byte changes the records."""
    weight = quantized_weight("q6_k", 16, 256, np.random.default_rng(3))
    before = cpu.pack_matrix(weight, layout="dot").data.copy()
    weight.data[5, 7] ^= 0x01
    assert not np.array_equal(cpu.pack_matrix(weight, layout="dot").data, before)


def test_formats_without_a_float_kernel_refuse_other_layouts():
    weight = quantized_weight("q5_0", 16, 64, np.random.default_rng(4))
    with pytest.raises(ValueError, match="dot layout only"):
        cpu.pack_matrix(weight, layout="grouped")
    assert not FORMATS["q5_0"].float_kernel
