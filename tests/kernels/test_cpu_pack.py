"""The dot layout's packing (csrc/cpu/pack_dot.c) against a numpy packing built on the
format row's block_fields (exactdraft/formats/table.py), byte for byte, for every format with a dot
kernel."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.formats import FORMATS
from exactdraft.kernels import cpu
from tests.kernels.test_cpu_lookup import LOOKUP_FORMATS, lookup_records
from tests.kernels.test_cpu_quantized import BLOCK_FORMATS, quantized_weight

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

DOT_GROUP = 16
NIBBLE_FORMATS = ("q4_0", "q4_1", "q4_k")
FLOAT_PARAMETER_FORMATS = ("q4_k", "q5_k", "q6_k")


def numpy_records(weight) -> np.ndarray:
    """kernels.h's dot layout from the block fields: per group of 16 rows and block of 32, the
    parameters (float16, float32 for the k formats) then the codes in 64-byte chunks."""
    if weight.format in LOOKUP_FORMATS:
        return lookup_records(weight)
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
    assert packed.data.tobytes() == numpy_records(weight).tobytes()


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
