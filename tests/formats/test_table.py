"""The weight-format table: one row per format, the same facts on the Python and the C side."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.errors import WeightError
from exactdraft.formats import FORMATS, QuantizedTensor, format_for_ggml_type, weight_format
from exactdraft.kernels import cpu


@pytest.mark.skipif(not cpu.available(), reason=f"CPU kernels: {cpu.unavailable_reason()}")
def test_the_c_kernels_carry_the_same_format_rows():
    python_side = {(row.kernel, row.name, row.block_size, row.block_bytes, row.float_kernel,
                    row.integer_dot) for row in FORMATS.values() if row.kernel is not None}
    c_side = {(code, name, block, size, bool(float_kernel), dot > 0)
              for code, name, block, size, float_kernel, dot in cpu.format_table()}
    assert c_side == python_side
    # Control: the comparison sees a changed fact.
    assert {(k, n, b, 1 + size, f, d) for k, n, b, size, f, d in c_side} != python_side


def test_gguf_type_ids_match_the_gguf_package():
    gguf = pytest.importorskip("gguf")
    for row in FORMATS.values():
        if row.ggml_type is None:  # a format GGUF has no type for (fp8_e4m3)
            continue
        kind = gguf.GGMLQuantizationType[row.name.upper()]
        assert int(kind) == row.ggml_type, row.name
        assert gguf.GGML_QUANT_SIZES[kind] == (row.block_size, row.block_bytes), row.name
        assert format_for_ggml_type(row.ggml_type) is row


def test_unknown_format_and_bad_blocks_are_named():
    with pytest.raises(WeightError, match="unknown weight format 'q7_0'.*q4_k"):
        weight_format("q7_0")
    with pytest.raises(WeightError, match=r"q4_k weights need K to be a multiple of 256"):
        QuantizedTensor("q4_k", np.zeros((2, 144), np.uint8), (2, 300))
    with pytest.raises(WeightError, match="must be uint8"):
        QuantizedTensor("q8_0", np.zeros((2, 35), np.uint8), (2, 32))
    with pytest.raises(WeightError, match="not a block format"):
        QuantizedTensor("f16", np.zeros((2, 64), np.uint8), (2, 32))


def test_take_rows_dequantizes_only_those_rows():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (6, 68), dtype=np.uint8)
    data[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    data[:, 34:36] = np.frombuffer(np.float16(-0.02).tobytes(), np.uint8)
    weight = QuantizedTensor("q8_0", data, (6, 64))
    ids = np.array([4, 1, 4])
    assert weight.take_rows(ids).tobytes() == weight.dequantize()[ids].tobytes()
