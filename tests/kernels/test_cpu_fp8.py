"""The C float kernel on fp8_e4m3 weights: the bytes of the same kernel on the float32 matrix the
blocks dequantize to, for every row count and SIMD level this machine runs, in both layouts.

The kernel decodes each block's codes exactly and multiplies by the block's float32 scale once,
so each weight is the float32 the checkpoint's dequantization gives; the per-element sequence of
fused multiply-adds depends only on K (kernel_body.h), so the outputs must be the same bytes.
The other levels (SIMDe-emulated x86, NEON under qemu) are held to the scalar level's bits by
check_levels.c, which covers fp8_e4m3 (tests/kernels/test_cpu_levels.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.kernels import cpu
from exactdraft.loading.fp8_blocks import dequantize_blocks, fp8_e4m3_matrix
from tests.formats.test_fp8_e4m3 import random_fp8
from tests.kernels.conftest import bits

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

ROW_COUNTS = (1, 2, 5, 17)


def fp8_matrix(rows: int, depth: int, block, seed: int, tiny: bool = False):
    codes, scales = random_fp8(rows, depth, block, seed, tiny)
    return codes, scales, fp8_e4m3_matrix(codes, scales, block)


@pytest.mark.parametrize("layout", ["grouped", "rows"])
@pytest.mark.parametrize("tiny", [False, True])
def test_fp8_matmul_is_the_float32_matmul(level, layout, tiny, restore_threads):
    block = (128, 128)
    codes, scales, held = fp8_matrix(77, 384, block, seed=11, tiny=tiny)
    dense = dequantize_blocks(codes, scales, block)
    packed = cpu.pack_matrix(held, layout=layout)
    reference = cpu.pack_matrix(dense, layout=layout)
    assert (packed.format, packed.layout) == ("fp8_e4m3", layout)
    assert packed.data.nbytes == 77 * 384 // 32 * 36
    rng = np.random.default_rng(12)
    bias = rng.standard_normal(77).astype(np.float32)
    for threads in (1, 2):
        cpu.set_num_threads(threads)
        for rows in ROW_COUNTS:
            x = rng.standard_normal((rows, 384)).astype(np.float32)
            for b in (None, bias):
                ours = cpu.matmul(x, packed, b)
                assert ours.tobytes() == cpu.matmul(x, reference, b).tobytes(), (rows, threads)
    if tiny:  # the weights compared include float32 subnormals
        assert (np.abs(dense[dense != 0]) < np.finfo(np.float32).tiny).any()


def test_one_changed_code_changes_the_bytes(level):
    """Negative control: the comparison above sees a single weight off."""
    block = (128, 128)
    codes, scales, held = fp8_matrix(40, 256, block, seed=13)
    reference = cpu.pack_matrix(dequantize_blocks(codes, scales, block))
    x = np.random.default_rng(14).standard_normal((5, 256)).astype(np.float32)
    assert cpu.matmul(x, cpu.pack_matrix(held), None).tobytes() == \
        cpu.matmul(x, reference, None).tobytes()
    held.data[7, 4 + 3 * 36 + 5] ^= 0x01  # one code of row 7, block 3
    changed = bits(cpu.matmul(x, cpu.pack_matrix(held), None))
    expected = bits(cpu.matmul(x, reference, None))
    assert not np.array_equal(changed, expected)
    assert np.array_equal(np.delete(changed, 7, axis=1), np.delete(expected, 7, axis=1))

