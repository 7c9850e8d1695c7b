"""Kernel paths the other interpreter tests do not reach: the tl.dot step, and every block
configuration the configuration choosers return for a GPU.

Under TRITON_INTERPRET=1, "auto" picks the rowwise reduction and matmul_config returns its CPU
configuration, so neither the tl.dot step nor the CUDA configurations would run here otherwise.
What the interpreter can show of them, and only that:
- tl.dot: the kernels compute the right thing through it (against float64, with the same
  error bound as the rowwise step: float32 accumulation plus one rounding to the output
  dtype). Not row invariance: the interpreter's tl.dot is numpy's matmul, whose bits follow the
  row count, so that claim needs the GPU (benchmarks/gpu_check.py). bfloat16 tl.dot returns
  garbage under the interpreter (test_triton_matmul.py shows it), so it is left to the GPU too.
- GPU configurations: each one the chooser can return (collected over a grid of weight shapes,
  head layouts and dtypes) tiles the work as on the GPU, and with the rowwise step every row
  keeps its one-row bits under it. Warps and stages have no meaning under the interpreter.
See tests/README.md.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("triton", reason="the Triton kernel tests need the triton package")

import torch  # noqa: E402

from exactdraft.kernels.triton import norm, softmax  # noqa: E402
from exactdraft.kernels.triton.attention import attention, attention_config  # noqa: E402
from exactdraft.kernels.triton.matmul import matmul, matmul_config  # noqa: E402

UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11}
WEIGHT_SHAPES = [(n, k) for n in (1, 64, 576, 4096, 8192, 8193, 32000, 151936)
                 for k in (64, 576, 4096, 14336)]
DTYPES = ("float32", "bfloat16", "float16")


def gpu_matmul_configs():
    return sorted({matmul_config(n, k, dtype, "cuda") for n, k in WEIGHT_SHAPES
                   for dtype in DTYPES}, key=repr)


def gpu_attention_configs():
    return sorted({attention_config(group, head_dim, dtype, "cuda") for group in range(1, 17)
                   for head_dim in (64, 128, 256) for dtype in DTYPES}, key=repr)


def rows(count: int, depth: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    scales = torch.tensor([1.0, 1e3, 1e-3, 1.0, 37.0])[torch.arange(count) % 5]
    return torch.randn(count, depth, generator=generator) * scales[:, None]


# -- the tl.dot step ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_matmul_through_tl_dot_matches_float64(dtype):
    depth, width = 200, 72  # neither a multiple of BLOCK_K nor of BLOCK_N
    x = rows(21, depth, seed=1).to(dtype)
    w = (torch.randn(width, depth, generator=torch.Generator().manual_seed(2)) / 8).to(dtype)
    bias = torch.randn(width, generator=torch.Generator().manual_seed(3)).to(dtype)
    out = matmul(x, w, bias, dot="native").double()
    exact = x.double() @ w.double().T + bias.double()
    magnitude = x.double().abs() @ w.double().abs().T + bias.double().abs()
    bound = depth * 2.0**-24 * magnitude + 2 * UNIT_ROUNDOFF[dtype] * exact.abs() + 1e-30
    assert ((out - exact).abs() <= bound).all()
    if dtype == torch.float32:
        # The native step really ran: its bits are not the rowwise step's everywhere (float16
        # outputs round the difference away).
        assert not torch.equal(out, matmul(x, w, bias, dot="rowwise").double())


def attention_float64(q, keys, values, positions, scale, window=0):
    group = q.shape[1] // keys.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for row, position in enumerate(positions.tolist()):
        first = max(0, position - window + 1) if window else 0
        for head in range(q.shape[1]):
            k = keys[head // group, first:position + 1].double()
            v = values[head // group, first:position + 1].double()
            out[row, head] = torch.softmax(k @ q[row, head].double() * scale, 0) @ v
    return out


@pytest.mark.parametrize("window", [0, 300])
def test_attention_through_tl_dot_matches_float64(window):
    """float32 in the default 512-key chunks of 64-key tiles, both dot steps (q.k and p.v)
    through tl.dot; rows past one chunk and at its edges."""
    generator = torch.Generator().manual_seed(4)
    keys, values = (torch.randn(2, 1024, 16, generator=generator) for _ in range(2))
    q = torch.randn(8, 6, 16, generator=generator) * 2
    positions = torch.tensor([0, 5, 63, 64, 511, 512, 700, 1000])
    scale = 1 / math.sqrt(16)
    out = attention(q, keys, values, positions, scale, window, dot="native").double()
    exact = attention_float64(q, keys, values, positions, scale, window)
    assert ((out - exact).abs() <= 1e-6 * (1 + exact.abs())).all()
    rowwise = attention(q, keys, values, positions, scale, window, dot="rowwise").double()
    assert not torch.equal(out, rowwise)


# -- every GPU configuration, rowwise, for row invariance --------------------------------------

def test_the_choosers_return_the_configurations_tested_below():
    """Guards the lists below against a chooser change: every configuration found is one the
    tests run (they are collected, not written out), and the GPU ones differ from the CPU one."""
    matmul_configs = gpu_matmul_configs()
    assert len(matmul_configs) >= 2
    assert all(c.block_m == 16 for c in matmul_configs)
    assert matmul_config(4096, 4096, "float32", "cpu") not in matmul_configs
    assert len(gpu_attention_configs()) >= 2


@pytest.mark.parametrize("config", gpu_matmul_configs(), ids=repr)
def test_matmul_rows_are_invariant_under_each_gpu_configuration(config, same_bits):
    # Depth and width straddle BLOCK_K and BLOCK_N; 40 rows cross two 16-row tiles.
    depth, width = config.block_k * 2 + 24, config.block_n + 9
    x = rows(40, depth, seed=5)
    w = torch.randn(width, depth, generator=torch.Generator().manual_seed(6)) / 8
    singles = torch.cat([matmul(x[i:i + 1], w, dot="rowwise", config=config)
                         for i in range(40)])
    for start, count in [(0, c) for c in (1, 2, 3, 5, 8, 15, 16, 17, 33, 40)] + [(3, 20)]:
        batch = matmul(x[start:start + count], w, dot="rowwise", config=config)
        assert same_bits(batch, singles[start:start + count]), (start, count)
    exact = x.double() @ w.double().T
    bound = depth * 2.0**-24 * (x.double().abs() @ w.double().abs().T) + 1e-30
    assert ((singles.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("config", gpu_attention_configs(), ids=repr)
def test_attention_rows_are_invariant_under_each_gpu_configuration(config, same_bits):
    """The configuration's row block (queries per program x padded heads per KV head) over
    a verify window straddling the first 512-key chunk boundary."""
    # A padded group where there is one (3 heads in a group of 4), else the group itself.
    group = config.group - 1 if config.group > 2 else config.group
    generator = torch.Generator().manual_seed(7)
    keys, values = (torch.randn(1, 528, 16, generator=generator) for _ in range(2))
    q = torch.randn(12, group, 16, generator=generator) * 2
    positions = torch.arange(504, 516)
    scale = 0.25
    singles = torch.cat([attention(q[i:i + 1], keys, values, positions[i:i + 1], scale,
                                   dot="rowwise", config=config) for i in range(12)])
    for start, count in ((0, 2), (0, 5), (3, 9), (0, 12)):
        batch = attention(q[start:start + count], keys, values, positions[start:start + count],
                          scale, dot="rowwise", config=config)
        assert same_bits(batch, singles[start:start + count]), (start, count)
    exact = attention_float64(q, keys, values, positions, scale)
    assert ((singles.double() - exact).abs() <= 1e-6 * (1 + exact.abs())).all()


@pytest.mark.parametrize("length", [3, 20, 100, 700, 3000, norm.MAX_BLOCK + 37],
                         ids=lambda length: f"length{length}")
def test_norm_and_softmax_rows_are_invariant_for_each_slice_width(length, same_bits):
    """Their slice width follows the row length (4 .. 4096, then several slices a row)."""
    x = rows(9, length, seed=8)
    weight = torch.randn(length, generator=torch.Generator().manual_seed(9))
    for compute in (lambda r: norm.rms_norm(r, weight, 1e-6), softmax.softmax):
        singles = torch.cat([compute(x[i:i + 1]) for i in range(9)])
        for start, count in ((0, 2), (0, 9), (4, 5)):
            assert same_bits(compute(x[start:start + count]), singles[start:start + count])
