"""The backends without integer-dot kernels for the ternary and 1-bit formats (the torch
reference backend, Triton's on device "cuda", here under Triton's interpreter, and MLX) take
tq1_0, tq2_0 and q1_0 weights dequantized at load to their exact float32 values; a format the
table does not know is refused with a WeightError naming the known ones."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

# Triton reads this once, when it is first imported; CPU tensors need the interpreter.
if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"

from exactdraft.errors import WeightError  # noqa: E402
from exactdraft.formats import QuantizedTensor  # noqa: E402
from tests.formats.test_ternary_blocks import random_blocks  # noqa: E402

FORMATS = ("tq1_0", "tq2_0", "q1_0")
FORMATS_BLOCK = {"tq1_0": 256, "tq2_0": 256, "q1_0": 128}


def weight(fmt: str) -> QuantizedTensor:
    """8 rows of 3 random blocks each."""
    blocks = random_blocks(fmt, 24, seed=len(fmt))
    depth = 3 * FORMATS_BLOCK[fmt]
    return QuantizedTensor(fmt, blocks.reshape(8, -1), (8, depth))


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_reference_backend_holds_the_exact_values(fmt):
    pytest.importorskip("torch")
    from exactdraft.backends.torch_backend import TorchBackend

    quantized = weight(fmt)
    matrix = TorchBackend().matrix(quantized)  # stored [K, N]
    assert matrix.t().contiguous().numpy().tobytes() == quantized.dequantize().tobytes()


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@pytest.mark.parametrize("fmt", FORMATS)
def test_triton_backend_holds_the_exact_values(fmt):
    pytest.importorskip("torch")
    from exactdraft.backends.torch_cuda import TorchCudaBackend

    quantized = weight(fmt)
    matrix = TorchCudaBackend(device="cpu", dtype="float32").matrix(quantized)  # [N, K]
    assert matrix.numpy().tobytes() == quantized.dequantize().tobytes()


@pytest.mark.parametrize("fmt", FORMATS)
def test_mlx_backend_holds_the_exact_values(fmt):
    mx = pytest.importorskip("mlx.core")
    from exactdraft.backends.mlx_backend import MLXBackend

    quantized = weight(fmt)
    matrix = MLXBackend(dtype="float32").matrix(quantized)
    assert np.array(matrix.astype(mx.float32)).tobytes() == quantized.dequantize().tobytes()


def test_an_unknown_block_format_is_refused_naming_the_known_ones():
    with pytest.raises(WeightError, match=r"unknown weight format 'tq3_0'.*tq1_0, tq2_0, q1_0"):
        QuantizedTensor("tq3_0", np.zeros((1, 66), np.uint8), (1, 256))


def test_control_a_changed_code_byte_changes_the_held_values():
    pytest.importorskip("torch")
    from exactdraft.backends.torch_backend import TorchBackend

    quantized = weight("tq2_0")
    before = TorchBackend().matrix(quantized).numpy().tobytes()
    quantized.data[2, 10] ^= 0x03
    assert TorchBackend().matrix(quantized).numpy().tobytes() != before
