"""The Triton RMS norm under the interpreter: accuracy, bitwise row invariance, controls."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the Triton kernel tests need the triton package")

import torch  # noqa: E402

from exactdraft.kernels.triton import norm  # noqa: E402
from exactdraft.kernels.triton.launch import KernelError  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ROW_COUNTS = list(range(1, 17)) + [31, 40]
EPS = 1e-6


def random_rows(count: int, length: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(count, length, generator=generator)
    return rows * torch.logspace(-3, 3, count)[torch.randperm(count, generator=generator), None]


def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    normed = x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + EPS)
    return normed * weight.double()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_float64_reference(dtype):
    x = random_rows(12, 300, seed=1).to(dtype)
    weight = torch.randn(300).to(dtype)
    out = norm.rms_norm(x, weight, EPS)
    assert out.dtype == dtype and out.shape == x.shape
    exact = reference(x, weight)
    # Two roundings to the output dtype (normed, then times the weight) plus fp32 sums; float16
    # results below 2**-14 are subnormal and only have an absolute spacing of 2**-24.
    unit = {torch.float32: 2.0**-21, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype]
    spacing = 2.0**-22 if dtype == torch.float16 else 0.0
    assert ((out.double() - exact).abs() <= unit * exact.abs() + spacing).all()


def test_agrees_with_the_torch_cpu_formula_in_float32():
    x = random_rows(6, 64, seed=2)
    weight = torch.randn(64)
    cpu = weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS))
    # Accuracy, not invariance: the two backends may round differently.
    assert ((norm.rms_norm(x, weight, EPS) - cpu).abs() <= 1e-6 * cpu.abs()).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_are_bitwise_invariant(dtype, same_bits):
    x = random_rows(40, 200, seed=3).to(dtype)
    weight = torch.randn(200).to(dtype)
    singles = torch.cat([norm.rms_norm(x[i:i + 1], weight, EPS) for i in range(40)])
    for count in ROW_COUNTS:
        assert same_bits(norm.rms_norm(x[:count], weight, EPS), singles[:count]), count
    shifted = norm.rms_norm(x[7:23], weight, EPS)
    assert same_bits(shifted, singles[7:23])


def test_rows_longer_than_one_slice(same_bits):
    length = norm.MAX_BLOCK + 37
    x = random_rows(3, length, seed=4)
    weight = torch.randn(length)
    out = norm.rms_norm(x, weight, EPS)
    expected = reference(x, weight)
    assert ((out.double() - expected).abs() <= 1e-5 * expected.abs()).all()
    assert same_bits(out[1:2], norm.rms_norm(x[1:2], weight, EPS))


def test_three_dimensional_input_norms_each_head(same_bits):
    """q/k norms pass [M, heads, head_dim]; each head is a row of its own."""
    x = random_rows(15, 32, seed=5).reshape(5, 3, 32)
    weight = torch.randn(32)
    out = norm.rms_norm(x, weight, EPS)
    assert same_bits(out.reshape(15, 32), norm.rms_norm(x.reshape(15, 32), weight, EPS))
    assert same_bits(out[2:3], norm.rms_norm(x[2:3], weight, EPS))


def test_a_row_count_dependent_slice_width_breaks_invariance(same_bits):
    """Negative control for the design: were the slice width picked per call from the row
    count, the sum of squares would be added in another order and rows would change bits."""
    length = 1000
    x = random_rows(16, length, seed=6)
    weight = torch.randn(length)

    def launch(rows, block):
        out = torch.empty_like(rows)
        norm._rms_norm_kernel[(rows.shape[0],)](rows, weight, out, length, EPS, BLOCK=block)
        return out

    singles = torch.cat([launch(x[i:i + 1], 1024) for i in range(16)])
    assert not same_bits(launch(x, 256), singles)


def test_bad_inputs_name_the_problem():
    with pytest.raises(KernelError, match=r"weight must have shape \(8,\)"):
        norm.rms_norm(torch.randn(2, 8), torch.randn(7), EPS)
    with pytest.raises(KernelError, match="eps"):
        norm.rms_norm(torch.randn(2, 8), torch.randn(8), -1.0)
