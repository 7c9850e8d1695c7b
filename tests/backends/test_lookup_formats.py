"""The backends without kernels for the lookup formats (iq4_nl, iq4_xs, mxfp4) dequantize them
at load: the padded torch backend, the Triton backend (on CPU tensors under Triton's
interpreter) and MLX (where installed) hold exactly gguf-py's float32 values of the blocks."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

# Triton reads this once, when it is first imported; CPU tensors need the interpreter.
if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"

torch = pytest.importorskip("torch", reason="the torch backends need torch")
gguf = pytest.importorskip("gguf")

from exactdraft.formats import FORMATS, QuantizedTensor  # noqa: E402

LOOKUP_FORMATS = ("iq4_nl", "iq4_xs", "mxfp4")


def lookup_weight(format: str) -> QuantizedTensor:
    row = FORMATS[format]
    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, (24 * 512 // row.block_size, row.block_bytes), np.uint8)
    if format == "mxfp4":
        blocks[:, 0] = rng.integers(110, 140, blocks.shape[0])
    else:
        halves = rng.uniform(-1e-3, 1e-3, blocks.shape[0]).astype("<f2")
        blocks[:, 0:2] = halves.view(np.uint8).reshape(-1, 2)
    return QuantizedTensor(format, blocks.reshape(24, -1), (24, 512))


def gguf_values(weight: QuantizedTensor) -> bytes:
    kind = gguf.GGMLQuantizationType[weight.format.upper()]
    return gguf.quants.dequantize(weight.data, kind).astype(np.float32).tobytes()


def backends() -> list:
    from exactdraft.backends.torch_backend import TorchBackend

    found = [TorchBackend()]
    if importlib.util.find_spec("triton") is not None:
        from exactdraft.backends.torch_cuda import TorchCudaBackend

        found.append(TorchCudaBackend(device="cpu", dtype="float32"))
    if importlib.util.find_spec("mlx.core") is not None:
        from exactdraft.backends.mlx_backend import MLXBackend

        found.append(MLXBackend())
    return found


@pytest.mark.parametrize("format", LOOKUP_FORMATS)
def test_backends_without_lookup_kernels_hold_the_exact_values(format):
    weight = lookup_weight(format)
    expected = gguf_values(weight)
    for backend in backends():
        held = np.asarray(backend.matrix(weight), dtype=np.float32)
        if held.shape == weight.shape[::-1]:  # the padded torch backend keeps W.T [K, N]
            held = np.ascontiguousarray(held.T)
        assert held.shape == weight.shape, backend
        assert held.tobytes() == expected, backend


def test_a_changed_block_is_seen():
    """Negative control: one changed code gives other values than the unchanged blocks."""
    weight = lookup_weight("iq4_xs")
    expected = gguf_values(weight)
    weight.data[3, 100] ^= 0x10
    held = np.asarray(backends()[0].matrix(weight), dtype=np.float32)
    assert np.ascontiguousarray(held.T).tobytes() != expected
