"""The Triton softmax and log-softmax under the interpreter: accuracy and bitwise invariance."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the Triton kernel tests need the triton package")

import torch  # noqa: E402

from exactdraft.kernels.triton import softmax  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ROW_COUNTS = list(range(1, 17)) + [31, 40]
FUNCTIONS = {"softmax": softmax.softmax, "log_softmax": softmax.log_softmax}


def random_logits(count: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scales = torch.tensor([1.0, 10.0, 0.01, 30.0])[torch.arange(count) % 4]
    return torch.randn(count, length, generator=generator) * scales[:, None]


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_float64_reference(name, dtype):
    x = random_logits(10, 333, seed=1).to(dtype)
    out = FUNCTIONS[name](x)
    assert out.dtype == torch.float32 and out.shape == x.shape
    exact = getattr(torch, name)(x.double(), dim=-1)
    if name == "softmax":
        assert ((out.double() - exact).abs() <= 1e-6 * exact + 1e-9).all()
    else:
        assert ((out.double() - exact).abs() <= 1e-6 * (1 + exact.abs())).all()


@pytest.mark.parametrize("name", FUNCTIONS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_are_bitwise_invariant(name, dtype, same_bits):
    function = FUNCTIONS[name]
    x = random_logits(40, 300, seed=2).to(dtype)
    singles = torch.cat([function(x[i:i + 1]) for i in range(40)])
    for count in ROW_COUNTS:
        assert same_bits(function(x[:count]), singles[:count]), count
    assert same_bits(function(x[5:21]), singles[5:21])


def test_rows_longer_than_one_slice_and_leading_dimensions(same_bits):
    length = softmax.MAX_BLOCK + 100
    x = random_logits(4, length, seed=3)
    out = softmax.softmax(x.reshape(2, 2, length))
    exact = torch.softmax(x.double(), dim=-1)
    assert ((out.reshape(4, length).double() - exact).abs() <= 1e-6 * exact + 1e-10).all()
    assert same_bits(out[1, 1], softmax.softmax(x[3:4])[0])


def test_a_row_count_dependent_slice_width_breaks_invariance(same_bits):
    """Negative control for the design: a slice width chosen per call changes the order in
    which exponentials are summed, and rows change bits; torch's own softmax happens to be
    row invariant on this CPU, so it cannot serve as the control."""
    length = 1000
    x = random_logits(16, length, seed=4)

    def launch(rows, block):
        out = torch.empty_like(rows)
        softmax._softmax_kernel[(rows.shape[0],)](rows, out, length, LOG=False, BLOCK=block)
        return out

    singles = torch.cat([launch(x[i:i + 1], 1024) for i in range(16)])
    assert not same_bits(launch(x, 256), singles)
