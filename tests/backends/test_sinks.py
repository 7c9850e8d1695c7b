"""Attention sinks in every backend (the padded torch ops, the C kernels, the Triton kernels under
the interpreter, MLX's own ops and its attention shader on the emulator): within float32
rounding of the float64 softmax over [scores, sink] across several key blocks (control: the sink
dropped misses it), and each row with the bits it gets alone, for every row count 1..9 and 40
(control: the rows of the whole pass sharing one stabiliser differ). A backend that does not
declare sinks is refused with a BackendError, as are sinks of another shape or not finite."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

import numpy as np
import pytest

# Triton reads this once, when it is first imported; CPU tensors need the interpreter.
if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"

from exactdraft.backends.sinks import require_attention_sinks, sink_logits
from exactdraft.errors import BackendError
from tests.kernels.test_cpu_attention_sinks import sink_reference

HEADS, KV_HEADS, DIM, CAPACITY = 6, 2, 16, 768
SINKS = np.array([-3.0, 0.0, 1.5, 4.0, -0.5, 9.0], np.float32)
HAS_MLX = importlib.util.find_spec("mlx") is not None
HAS_TRITON = importlib.util.find_spec("triton") is not None


def make_backend(name: str):
    if name == "torch-padded":
        from exactdraft.backends.torch_backend import TorchBackend

        return TorchBackend()
    if name == "torch-c":
        from exactdraft.kernels import cpu

        if not cpu.available():
            pytest.skip(f"CPU kernels unavailable: {cpu.unavailable_reason()}")
        from exactdraft.backends.torch_cpu import TorchCPUBackend

        return TorchCPUBackend()
    if name == "triton":
        if not HAS_TRITON:
            pytest.skip("needs the triton package")
        from exactdraft.backends.torch_cuda import TorchCudaBackend

        return TorchCudaBackend(device="cpu", dtype="float32", dot="rowwise")
    if not HAS_MLX:
        pytest.skip("mlx is not installed (Linux: pip install 'mlx[cpu]')")
    from exactdraft.backends.mlx_backend import MLXBackend

    if name == "mlx-shaders":
        if shutil.which("c++") is None:
            pytest.skip("the shader emulator needs a C++ compiler (c++)")
        return MLXBackend(shaders="emulator")
    return MLXBackend()


BACKENDS = ("torch-padded", "torch-c", "triton", "mlx", "mlx-shaders")


def problem(seed: int, rows: int):
    rng = np.random.default_rng(seed)
    keys, values = (rng.standard_normal((KV_HEADS, CAPACITY, DIM)).astype(np.float32)
                    for _ in range(2))
    q = rng.standard_normal((rows, HEADS, DIM)).astype(np.float32)
    return q, keys, values


def attend(be, q, keys, values, positions, window, sinks=SINKS) -> np.ndarray:
    return be.to_host(be.attention(be.vector(q), be.vector(keys), be.vector(values),
                                   np.asarray(positions), window, 0.25, sinks=sinks))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("window", [0, 300])
def test_sinks_match_the_softmax_and_rows_keep_their_bits_alone(name, window):
    be = make_backend(name)
    assert be.attention_sinks
    q, keys, values = problem(1, 40)
    positions = np.sort(np.random.default_rng(2).choice(np.arange(200, 700), 40, replace=False))
    together = attend(be, q, keys, values, positions, window)
    reference = sink_reference(q, keys, values, positions, window, 0.25, SINKS)
    assert np.abs(together - reference).max() < 2e-6
    dropped = attend(be, q, keys, values, positions, window, sinks=None)
    assert np.abs(dropped - reference).max() > 1e-2
    alone = [attend(be, q[r:r + 1], keys, values, positions[r:r + 1], window)
             for r in range(40)]
    for rows in (*range(1, 10), 40):
        part = attend(be, q[:rows], keys, values, positions[:rows], window)
        assert part.tobytes() == np.concatenate(alone[:rows]).tobytes(), rows


def test_negative_control_one_stabiliser_for_the_pass_changes_the_bits():
    """The torch reference with the pass's largest score as every row's stabiliser (the same
    function): rows get other bits than alone, so the comparison above can fail."""
    import torch

    be = make_backend("torch-padded")
    q, keys, values = problem(3, 16)
    positions = np.arange(500, 516)
    group = HEADS // KV_HEADS
    key_span = torch.from_numpy(np.repeat(keys[:, :516], group, 0))
    value_span = torch.from_numpy(np.repeat(values[:, :516], group, 0))

    def pass_stabilised(rows: slice) -> np.ndarray:
        scores = torch.einsum("mhd,hld->hml", torch.from_numpy(q[rows]), key_span) * 0.25
        visible = torch.arange(516)[None, :] <= torch.from_numpy(positions[rows])[:, None]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        sink = torch.from_numpy(SINKS)[:, None, None]
        top = torch.maximum(scores.amax(dim=(1, 2), keepdim=True), sink)
        weights = torch.exp(scores - top)
        total = torch.exp(sink - top) + weights.sum(-1, keepdim=True)
        return (weights @ value_span / total).permute(1, 0, 2).numpy()

    together = pass_stabilised(slice(None))
    reference = sink_reference(q, keys, values, positions, 0, 0.25, SINKS)
    assert np.abs(together - reference).max() < 2e-6
    alone = np.concatenate([pass_stabilised(slice(r, r + 1)) for r in range(16)])
    assert together.tobytes() != alone.tobytes()
    assert attend(be, q, keys, values, positions, 0).tobytes() == np.concatenate(
        [attend(be, q[r:r + 1], keys, values, positions[r:r + 1], 0)
         for r in range(16)]).tobytes()


def test_a_backend_that_does_not_declare_sinks_is_refused():
    class Plain:
        def __repr__(self) -> str:
            return "Plain()"

    with pytest.raises(BackendError, match=r"model m has attention sinks, which Plain\(\)"):
        require_attention_sinks(Plain(), "model m")
    require_attention_sinks(make_backend("torch-padded"), "model m")  # no error


@pytest.mark.parametrize("sinks,match", [
    (np.zeros(5, np.float32), r"shape \(6,\) \(one per query head\), got \(5,\)"),
    (np.zeros((6, 1), np.float32), r"got \(6, 1\)"),
    (np.array([0, 0, np.nan, 0, 0, 0], np.float32), "must be finite, got \\[nan\\]"),
])
@pytest.mark.parametrize("name", BACKENDS)
def test_bad_sinks_are_refused(name, sinks, match):
    with pytest.raises(BackendError, match=match):
        sink_logits(sinks, HEADS)
    be = make_backend(name)
    q, keys, values = problem(5, 2)
    with pytest.raises(BackendError, match=match):
        attend(be, q, keys, values, [3, 4], 0, sinks=sinks)
