"""Tests of the C kernels' integer-dot matmul (the "dot" layout of q8_0, q4_0 and q4_1 weights):
bitwise agreement with a numpy emulation of its block formula, accuracy against float64, and
bitwise row invariance on every SIMD level with 1 and 2 threads, with negative controls.

The emulation mirrors the kernel's float32 steps one by one (numpy's float32 operations are
correctly rounded IEEE operations, and the integer block sums are exact), so the kernel must
reproduce its bits exactly, on every level.
"""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.formats import QuantizedTensor
from exactdraft.kernels import cpu
from tests.kernels.conftest import SIMD_LEVELS, assert_rows_match_alone, bits
from tests.kernels.test_cpu import ROW_COUNTS, exact_values, weight_source

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

BLOCK_FORMATS = ("q8_0", "q4_0", "q4_1")


def quantized_weight(format: str, rows: int, depth: int, rng) -> QuantizedTensor:
    return weight_source(format, rng.standard_normal((rows, depth)).astype(np.float32))


# -- the numpy emulation -----------------------------------------------------------------------

def quantize_reference(x: np.ndarray):
    """Per block of 32: d = max |x| / 127, q = rint(x / d) clamped to [-127, 127] (0 where d is
    0); returns q int8 [M, K], d, d * sum(q) float32 and sum(q) int32 [M, K / 32]."""
    rows, depth = x.shape
    blocks = x.reshape(rows, depth // 32, 32)
    scale = np.abs(blocks).max(-1) / np.float32(127)
    divisor = np.where(scale != 0, scale, np.float32(1))
    q = np.clip(np.rint(blocks / divisor[..., None]), -127, 127).astype(np.int8)
    sums = q.astype(np.int32).sum(-1, dtype=np.int32)
    return q.reshape(rows, depth), scale, scale * sums.astype(np.float32), sums


def block_parts(weight: QuantizedTensor):
    """Per weight block: the scale d, q4_1's minimum m (else None) and the integer weights the
    block sum multiplies (w for q8_0, q - 8 for q4_0, q for q4_1)."""
    rows, depth = weight.shape
    raw = weight.data.reshape(rows, depth // 32, -1)

    def half(offset):
        return raw[..., offset:offset + 2].copy().view(np.float16).astype(np.float32)[..., 0]

    if weight.format == "q8_0":
        return half(0), None, raw[..., 2:].copy().view(np.int8).astype(np.int64)
    packed = raw[..., 4:] if weight.format == "q4_1" else raw[..., 2:]
    codes = np.concatenate([packed & 15, packed >> 4], axis=-1).astype(np.int64)
    if weight.format == "q4_0":
        return half(0), None, codes - 8
    return half(0), half(2), codes


def dot_reference(x: np.ndarray, weight: QuantizedTensor, bias=None,
                  quantized=None) -> np.ndarray:
    """The kernel's formula in numpy: for each block in order, acc = acc + (d_w * d_x) * isum
    (q4_1: + m_w * (d_x * sum q)), one float32 rounding per step; then + bias."""
    q, scale, scaled_sum, _ = quantized or quantize_reference(x)
    weight_scale, minimum, codes = block_parts(weight)
    rows, depth = x.shape
    q_blocks = q.reshape(rows, depth // 32, 32).astype(np.int64)
    acc = np.zeros((rows, weight.shape[0]), np.float32)
    for b in range(depth // 32):
        isum = (q_blocks[:, b] @ codes[:, b].T).astype(np.float32)  # exact: |isum| < 2^24
        term = (weight_scale[None, :, b] * scale[:, b, None]) * isum
        if minimum is not None:
            term = term + minimum[None, :, b] * scaled_sum[:, b, None]
        acc = acc + term
    return acc if bias is None else acc + bias


def awkward_rows(rng, rows: int, depth: int) -> np.ndarray:
    """Random rows with a zero block, a huge row, a tiny row and a row of one sign."""
    x = rng.standard_normal((rows, depth)).astype(np.float32)
    x[0, :32] = 0.0
    x[rows // 2] *= 1e-20
    x[-1] *= 1e15
    if rows > 3:
        x[1] = np.abs(x[1])
    return x


# -- bits against the emulation ----------------------------------------------------------------

def test_quantize_rows_matches_the_emulation_bitwise(level):
    x = awkward_rows(np.random.default_rng(20), 7, 160)
    x[2, 40] = -np.float32(3.5) * (np.abs(x[2, 32:64]).max() / 127)  # a tie: rint to even
    for ours, theirs in zip(cpu.quantize_rows(x), quantize_reference(x)):
        assert ours.dtype == theirs.dtype
        assert np.array_equal(ours.view(np.uint8), theirs.view(np.uint8))


@pytest.mark.parametrize("format", BLOCK_FORMATS)
def test_dot_matmul_matches_the_emulation_bitwise(level, format):
    rng = np.random.default_rng(21)
    weight = quantized_weight(format, 37, 192, rng)  # 37 columns: a partial group of 16
    packed = cpu.pack_matrix(weight, layout="dot")
    bias = rng.standard_normal(37).astype(np.float32)
    for rows in (1, 3, 9):
        x = awkward_rows(rng, rows, 192)
        for b in (None, bias):
            assert np.array_equal(bits(cpu.matmul(x, packed, b)), bits(dot_reference(x, weight, b)))


@pytest.mark.parametrize("format", BLOCK_FORMATS)
def test_dot_matmul_gives_the_same_bits_on_every_level(format):
    rng = np.random.default_rng(22)
    packed = cpu.pack_matrix(quantized_weight(format, 70, 256, rng), layout="dot")
    x = awkward_rows(rng, 11, 256)
    default, results = cpu.simd_level(), []
    try:
        for name in SIMD_LEVELS:
            cpu.set_simd_level(name)
            results.append(bits(cpu.matmul(x, packed)))
    finally:
        cpu.set_simd_level(default)
    assert all(np.array_equal(results[0], other) for other in results[1:])


# -- accuracy ----------------------------------------------------------------------------------

@pytest.mark.parametrize("format", BLOCK_FORMATS)
def test_dot_matmul_accuracy_against_float64(format, record_property):
    """Activations lose about 2^-8 to int8 rounding per element, so the result is within about
    1e-2 of x @ W computed in float64 on the dequantized weights, as llama.cpp's is."""
    rng = np.random.default_rng(23)
    weight = quantized_weight(format, 300, 576, rng)
    x = rng.standard_normal((8, 576)).astype(np.float32)
    exact = x.astype(np.float64) @ exact_values(weight).T
    out = cpu.matmul(x, cpu.pack_matrix(weight, layout="dot"))
    relative = np.abs(out - exact).max() / np.abs(exact).max()
    typical = np.sqrt(np.mean((out - exact) ** 2) / np.mean(exact**2))
    record_property("max_relative_error", float(relative))
    record_property("rms_relative_error", float(typical))
    assert relative < 3e-2 and typical < 1e-2
    float_path = cpu.matmul(x, cpu.pack_matrix(weight))  # float activations: far closer
    assert np.abs(float_path - exact).max() / np.abs(exact).max() < 1e-5 < relative


# -- row invariance ----------------------------------------------------------------------------

@pytest.mark.parametrize("format", BLOCK_FORMATS)
@pytest.mark.parametrize("threads", (1, 2))
def test_dot_matmul_row_invariance(level, format, threads, restore_threads):
    # 517 x 320 puts even M = 1 on the thread pool (N * K above its threshold).
    cpu.set_num_threads(threads)
    rng = np.random.default_rng(24)
    packed = cpu.pack_matrix(quantized_weight(format, 517, 320, rng), layout="dot")
    bias = rng.standard_normal(517).astype(np.float32)
    for rows in ROW_COUNTS:
        x = awkward_rows(rng, rows, 320)
        assert_rows_match_alone(x, packed, bias)


@pytest.mark.parametrize("format", BLOCK_FORMATS)
def test_dot_matmul_same_bits_for_every_thread_count(format, restore_threads):
    rng = np.random.default_rng(25)
    packed = cpu.pack_matrix(quantized_weight(format, 700, 256, rng), layout="dot")
    x = rng.standard_normal((9, 256)).astype(np.float32)
    results = []
    for threads in (1, 2, 3):
        cpu.set_num_threads(threads)
        results.append(bits(cpu.matmul(x, packed)))
    assert all(np.array_equal(results[0], other) for other in results[1:])


def test_a_pass_wide_activation_scale_breaks_row_invariance():
    """Negative control: quantizing a pass's activations with one scale for all its rows (as a
    per-tensor scheme would) gives a row other bits when the other rows change, so the
    comparisons above can fail; per-row scales are what keeps rows invariant."""
    rng = np.random.default_rng(26)
    weight = quantized_weight("q4_1", 40, 64, rng)

    def pass_wide(x):
        q, scale, scaled_sum, sums = quantize_reference(x)
        shared = np.broadcast_to(scale.max(0), scale.shape)
        divisor = np.where(shared != 0, shared, np.float32(1))
        blocks = x.reshape(x.shape[0], -1, 32) / divisor[..., None]
        q = np.clip(np.rint(blocks), -127, 127).astype(np.int8)
        sums = q.astype(np.int32).sum(-1)
        quantized = (q.reshape(x.shape), shared, shared * sums.astype(np.float32), sums)
        return dot_reference(x, weight, quantized=quantized)

    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[3] *= 10
    together = bits(pass_wide(x))
    assert not all(np.array_equal(together[r], bits(pass_wide(x[r:r + 1]))[0]) for r in range(4))
    per_row = bits(dot_reference(x, weight))  # the kernel's scheme keeps them
    assert all(np.array_equal(per_row[r], bits(dot_reference(x[r:r + 1], weight))[0])
               for r in range(4))


def test_unpadded_torch_matmul_on_dequantized_weights_breaks_row_invariance():
    """Negative control: torch's plain `x @ W.T` on the same (dequantized) weights gives rows
    other bits when M changes."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(27)
    weight = torch.from_numpy(quantized_weight("q4_1", 517, 320, rng).dequantize())
    broken = 0
    for rows in range(2, 17):
        x = torch.from_numpy(awkward_rows(rng, rows, 320))
        together = x @ weight.T
        broken += sum(not torch.equal(together[r], (x[r:r + 1] @ weight.T)[0])
                      for r in range(rows))
    assert broken > 0


# -- the layout --------------------------------------------------------------------------------

@pytest.mark.parametrize("format", BLOCK_FORMATS)
def test_dot_layout_pads_to_whole_groups_and_refuses_float_weights(format):
    weight = quantized_weight(format, 37, 64, np.random.default_rng(28))
    packed = cpu.pack_matrix(weight, layout="dot")
    assert packed.layout == "dot" and packed.shape == (37, 64)
    assert packed.data.shape == (3, weight.data.shape[1] * cpu.DOT_GROUP)
    with pytest.raises(ValueError, match="dot layout needs"):
        cpu.pack_matrix(np.zeros((16, 64), np.float32), layout="dot")


# -- larger shapes -----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("format", BLOCK_FORMATS)
@pytest.mark.parametrize("depth,columns", [(576, 1536), (1536, 576)])
def test_dot_matmul_row_invariance_model_shapes(format, depth, columns, restore_threads):
    rng = np.random.default_rng(29)
    weight = quantized_weight(format, columns, depth, rng)
    packed = cpu.pack_matrix(weight, layout="dot")
    for threads in (1, 2):
        cpu.set_num_threads(threads)
        for rows in (*range(1, 17), 64, 129):
            x = rng.standard_normal((rows, depth)).astype(np.float32)
            together = bits(cpu.matmul(x, packed))
            assert np.array_equal(together, bits(dot_reference(x, weight)))
            for r in range(rows):
                assert np.array_equal(together[r:r + 1], bits(cpu.matmul(x[r:r + 1], packed)))
