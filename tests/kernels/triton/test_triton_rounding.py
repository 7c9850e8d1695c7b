"""round_to_dtype: float32 to the output dtype, nearest-even, in the interpreter as on a GPU."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton", reason="the Triton kernel tests need the triton package")

import torch  # noqa: E402
import triton.language as tl  # noqa: E402

from exactdraft.kernels.triton.rounding import round_to_dtype  # noqa: E402


@triton.jit
def _store_rounded(x_ptr, out_ptr, n, ROUNDED: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    if ROUNDED:
        out = round_to_dtype(x, out_ptr.dtype.element_ty)
    else:
        out = x.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + offsets, out, mask=offsets < n)


def hard_cases() -> torch.Tensor:
    """Ties (odd and even), values just off a tie, overflow, subnormals, signed zeros, inf."""
    ties = torch.tensor([0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7FFFFF,
                         0x00008000, 0x00018000, 0x80000000, 0x7F800000, 0xFF800000],
                        dtype=torch.int64).to(torch.int32).view(torch.float32)
    halves = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 65520.0, 65519.0, 2**-25, 3 * 2**-26])
    generator = torch.Generator().manual_seed(0)
    spread = torch.randn(1000, generator=generator) * torch.logspace(-30, 30, 1000)
    return torch.cat([ties, halves, -halves, spread])


def rounded(x: torch.Tensor, dtype: torch.dtype, helper: bool = True) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=dtype)
    _store_rounded[(1,)](x, out, x.numel(), ROUNDED=helper, BLOCK=2048)
    return out


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_matches_torch_round_to_nearest_even(dtype):
    x = hard_cases()
    expected = x.to(dtype)
    assert torch.equal(rounded(x, dtype).view(torch.int16 if dtype != torch.float32
                                               else torch.int32),
                       expected.view(torch.int16 if dtype != torch.float32 else torch.int32))


def test_nan_stays_nan():
    x = torch.tensor([0x7F800001, 0x7FFFFFFF, 0xFFC00000],
                     dtype=torch.int64).to(torch.int32).view(torch.float32)
    assert torch.isnan(rounded(x, torch.bfloat16).float()).all()


def test_the_interpreters_own_bfloat16_cast_truncates():
    """Why the helper exists: a plain cast under the interpreter rounds toward zero."""
    x = hard_cases()
    assert not torch.equal(rounded(x, torch.bfloat16, helper=False).view(torch.int16),
                           x.to(torch.bfloat16).view(torch.int16))
