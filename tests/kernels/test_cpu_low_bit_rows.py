"""Tests of the low-bit formats' integer-dot decode (q2_k, q3_k, tq2_0, q1_0 and tq1_0) at every
tile row count: a level may decode these codes one way for a few rows (the decode-shaped
matvec) and another way for many (q2_k's codes scaled by their sub-scales once per block), and
every row count must give the numpy emulation's bits on every SIMD level. A negative control
shows that the comparison sees a changed code through both decodes.
"""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.formats import QuantizedTensor
from exactdraft.kernels import cpu
from tests.kernels.conftest import bits
from tests.kernels.test_cpu_quantized import awkward_rows, dot_reference, quantized_weight

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

LOW_BIT_FORMATS = ("q2_k", "q3_k", "tq2_0", "q1_0", "tq1_0")
# A byte of codes in the first block of each format (gguf's block layout).
CODE_BYTE = {"q2_k": 16, "q3_k": 32, "tq2_0": 0, "q1_0": 2, "tq1_0": 0}
MOST_ROWS = 17  # every tile row count of every level, then part of a second tile


@pytest.mark.parametrize("format", LOW_BIT_FORMATS)
def test_every_row_count_gives_the_emulation_bits(level, format):
    rng = np.random.default_rng(31)
    weight = quantized_weight(format, 40, 512, rng)  # two groups of 16 columns and a partial one
    packed = cpu.pack_matrix(weight, layout="dot")
    x = awkward_rows(rng, MOST_ROWS, 512)
    # Rows are quantized and summed on their own, so the first rows' reference is a slice.
    expected = bits(dot_reference(x, weight))
    for rows in range(1, MOST_ROWS + 1):
        assert np.array_equal(bits(cpu.matmul(x[:rows], packed)), expected[:rows]), rows


@pytest.mark.parametrize("format", LOW_BIT_FORMATS)
def test_a_changed_code_changes_only_its_column(format):
    """Negative control: one code byte changed in one weight row gives that output column other
    bits (which the emulation of the changed weight reproduces) for one row and for a full
    tile, and leaves the other columns alone."""
    rng = np.random.default_rng(32)
    weight = quantized_weight(format, 16, 512, rng)
    data = weight.data.copy()
    data[3, CODE_BYTE[format]] ^= 0xFF
    changed = QuantizedTensor(format, data, weight.shape)
    x = rng.standard_normal((9, 512)).astype(np.float32)
    for rows in (1, 9):
        ours = cpu.matmul(x[:rows], cpu.pack_matrix(weight, layout="dot"))
        theirs = cpu.matmul(x[:rows], cpu.pack_matrix(changed, layout="dot"))
        assert not np.array_equal(bits(ours[:, 3]), bits(theirs[:, 3]))
        others = np.arange(16) != 3
        assert np.array_equal(bits(ours[:, others]), bits(theirs[:, others]))
        assert np.array_equal(bits(theirs), bits(dot_reference(x[:rows], changed)))


@pytest.mark.parametrize("threads", [1, 2])
def test_q1_0_lookup_matvec_gives_the_emulation_bits(level, threads, restore_threads):
    """q1_0 with enough output columns and few rows takes the table lookup on the avx512vnni
    level of a CPU with VBMI (dot_sign_lookup.h; from 128 columns, 1 and 3 to 8 rows) and the
    bytewise decode with 2 rows, past 8 and everywhere else: every row count gives the numpy
    emulation's bits, and a changed code changes its column through the lookup too. One row
    reads four groups at a time: 313 columns end in a partial fourth group (on one thread,
    the whole width in one call)."""
    cpu.set_num_threads(threads)
    rng = np.random.default_rng(33)
    weight = quantized_weight("q1_0", 313, 1024, rng)
    packed = cpu.pack_matrix(weight, layout="dot")
    x = awkward_rows(rng, 10, 1024)
    expected = bits(dot_reference(x, weight))
    for rows in range(1, 11):
        assert np.array_equal(bits(cpu.matmul(x[:rows], packed)), expected[:rows]), rows
    data = weight.data.copy()
    data[310, 18 + 7] ^= 0x10  # the second GGUF block of 128: awkward rows start with zeros
    changed = QuantizedTensor("q1_0", data, weight.shape)
    theirs = cpu.matmul(x[:1], cpu.pack_matrix(changed, layout="dot"))
    assert not np.array_equal(bits(theirs[:, 310]), expected[:1, 310])
    assert np.array_equal(bits(theirs), bits(dot_reference(x[:1], changed)))
