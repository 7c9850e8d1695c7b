"""The Triton matmul under the interpreter: accuracy, bitwise row invariance, negative controls."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the Triton kernel tests need the triton package")

import torch  # noqa: E402

from exactdraft.kernels.triton.launch import KernelError  # noqa: E402
from exactdraft.kernels.triton.matmul import MatmulConfig, matmul, matmul_config  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Every row count up to one 16-row tile, then counts around the next tile boundaries.
ROW_COUNTS = list(range(1, 17)) + [17, 31, 32, 33, 40]
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def random_rows(count: int, depth: int, seed: int) -> torch.Tensor:
    """Normal rows, some scaled up and some down, so rounding is exercised at every size."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(count, depth, generator=generator)
    scales = torch.tensor([1.0, 1e3, 1e-3, 1.0, 37.0])[torch.arange(count) % 5]
    return rows * scales[:, None]


def assert_rows_invariant(compute, inputs, same_bits, row_counts=ROW_COUNTS, offsets=(0, 3)):
    """compute(rows) on every window inputs[s:s + M] gives each row its one-row bits."""
    singles = torch.cat([compute(inputs[i:i + 1]) for i in range(inputs.shape[0])])
    for offset in offsets:
        for count in row_counts:
            if offset + count > inputs.shape[0]:
                continue
            batch = compute(inputs[offset:offset + count])
            expected = singles[offset:offset + count]
            for row in range(count):
                assert same_bits(batch[row], expected[row]), (
                    f"row {offset + row} differs at position {row} of a {count}-row pass")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float64_reference(dtype, with_bias):
    depth, width = 200, 72  # neither a multiple of BLOCK_K nor of BLOCK_N
    x = random_rows(21, depth, seed=1).to(dtype)
    w = (torch.randn(width, depth, generator=torch.Generator().manual_seed(2)) / 8).to(dtype)
    bias = torch.randn(width).to(dtype) if with_bias else None
    out = matmul(x, w, bias)
    assert out.dtype == dtype and out.shape == (21, width)
    exact = x.double() @ w.double().T + (bias.double() if with_bias else 0.0)
    magnitude = x.double().abs() @ w.double().abs().T
    # fp32 accumulation error plus one rounding to the output dtype.
    bound = depth * 2.0**-24 * magnitude + 2 * UNIT_ROUNDOFF[dtype] * exact.abs() + 1e-30
    assert ((out.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_are_bitwise_invariant(dtype, same_bits):
    depth, width = 96, 40
    x = random_rows(40, depth, seed=3).to(dtype)
    w = torch.randn(width, depth, generator=torch.Generator().manual_seed(4)).to(dtype)
    bias = torch.randn(width).to(dtype)
    assert_rows_invariant(lambda rows: matmul(rows, w, bias), x, same_bits)


def test_rows_do_not_see_their_neighbours(same_bits):
    """Replacing every other row of a pass, even by huge values, leaves a row's bits alone."""
    x = random_rows(20, 64, seed=5)
    w = torch.randn(24, 64)
    noisy = x.clone()
    noisy[1::2] = 1e30
    assert same_bits(matmul(x, w)[0::2], matmul(noisy, w)[0::2])


def test_configuration_depends_on_the_weight_alone(monkeypatch):
    """The chooser takes no row count, BLOCK_M is 16 for every weight, and matmul asks it with
    the same arguments (so gets the same configuration) whatever the number of rows."""
    import inspect

    from exactdraft.kernels.triton import matmul as module

    assert list(inspect.signature(matmul_config).parameters) == ["n", "k", "dtype",
                                                                  "device_type"]
    for device_type in ("cpu", "cuda"):
        for dtype in ("float32", "bfloat16", "float16"):
            for n, k in ((1, 64), (576, 1536), (8193, 4096), (151936, 896)):
                assert matmul_config(n, k, dtype, device_type).block_m == 16
    asked = []

    def spy(*args, **kwargs):
        asked.append(tuple(inspect.signature(matmul_config).bind(*args, **kwargs).arguments
                           .values()))
        return matmul_config(*args, **kwargs)

    monkeypatch.setattr(module, "matmul_config", spy)
    w = torch.randn(24, 64)
    for count in (1, 2, 7, 16, 17, 40):
        matmul(torch.randn(count, 64), w)
    assert asked == [(24, 64, "float32", "cpu")] * 6


def test_an_m_dependent_block_k_breaks_invariance(same_bits):
    """Negative control for the design: choosing BLOCK_K by row count, as an autotuner might,
    changes a row's K order and its bits, and the invariance check above would catch it."""
    x = random_rows(16, 256, seed=6)
    w = torch.randn(32, 256)

    def m_dependent(rows):
        block_k = 64 if rows.shape[0] == 1 else 32
        return matmul(rows, w, config=MatmulConfig(block_k=block_k))

    singles = torch.cat([m_dependent(x[i:i + 1]) for i in range(16)])
    assert not same_bits(m_dependent(x), singles)


def test_plain_torch_matmul_is_not_row_invariant_here(same_bits):
    """Negative control: the unpadded `x @ W.T` of torch on this CPU changes rows with M."""
    x = random_rows(16, 256, seed=7)
    w = torch.randn(40, 256)
    singles = torch.cat([x[i:i + 1] @ w.T for i in range(16)])
    assert any(not same_bits(x[:count] @ w.T, singles[:count]) for count in range(2, 17))


def test_interpreter_tl_dot_is_unusable_for_bfloat16():
    """Why the interpreter tests use the rowwise dot: its tl.dot returns garbage for bf16."""
    x = random_rows(4, 64, seed=8).to(torch.bfloat16)
    w = torch.randn(32, 64).to(torch.bfloat16)
    exact = x.double() @ w.double().T
    native = matmul(x, w, dot="native").double()
    rowwise = matmul(x, w, dot="rowwise").double()
    assert (rowwise - exact).abs().max() <= 0.01 * exact.abs().max()
    assert not (native - exact).abs().max() <= 0.01 * exact.abs().max()


def test_bad_inputs_name_the_problem():
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    with pytest.raises(KernelError, match="K = 8"):
        matmul(x, torch.randn(5, 9))
    with pytest.raises(KernelError, match="share one dtype"):
        matmul(x, w.to(torch.bfloat16))
    with pytest.raises(KernelError, match=r"bias must have shape \(5,\)"):
        matmul(x, w, torch.randn(4))
    with pytest.raises(KernelError, match="dot mode"):
        matmul(x, w, dot="fast")
    with pytest.raises(KernelError, match="float64"):
        matmul(x.double(), w.double())


def test_zero_rows_and_strided_inputs(same_bits):
    w = torch.randn(16, 32)
    assert matmul(torch.randn(0, 32), w).shape == (0, 16)
    x = torch.randn(7, 64)[:, ::2]
    assert same_bits(matmul(x, w), matmul(x.contiguous(), w))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_are_bitwise_invariant_at_larger_shapes(dtype, same_bits):
    depth, width = 1024, 160
    x = random_rows(70, depth, seed=9).to(dtype)
    w = (torch.randn(width, depth, generator=torch.Generator().manual_seed(10))
         * depth ** -0.5).to(dtype)  # keeps float16 results finite
    counts = list(range(1, 17)) + [31, 32, 33, 47, 48, 49, 64, 65]
    assert_rows_invariant(lambda rows: matmul(rows, w), x, same_bits, counts, offsets=(0, 5))
