"""Tests of the C kernels' integer-dot matmul (the "dot" layout of q8_0, q4_0, q4_1, q5_0, q5_1,
q2_k, q3_k, q4_k, q5_k and q6_k weights): bitwise agreement with a numpy emulation of its block
formula, accuracy against float64, and bitwise row invariance on every SIMD level with 1 and 2
threads, with negative controls.

The emulation mirrors the kernel's float32 steps one by one (numpy's float32 operations are
correctly rounded IEEE operations, and the integer block sums are exact), so the kernel must
reproduce its bits exactly, on every level.
"""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.formats import FORMATS, QuantizedTensor
from exactdraft.kernels import cpu
from tests.kernels.conftest import SIMD_LEVELS, assert_rows_match_alone, bits
from tests.kernels.test_cpu import ROW_COUNTS, exact_values, weight_source

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

BLOCK_FORMATS = tuple(name for name, row in FORMATS.items() if row.integer_dot)
# Byte offsets of each format's float16 fields within a block (the rest may be any bytes).
HALF_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2),
               "q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,),
               "tq1_0": (52,), "tq2_0": (64,), "q1_0": (0,),
               "iq4_nl": (0,), "iq4_xs": (0,)}
# q2_k and q3_k: the kernel applies their integer sub-scales to each half's exact sum and the
# super-block's float16 d (and -dmin) in the float steps.
K_LOW_FORMATS = ("q2_k", "q3_k")


def quantized_weight(format: str, rows: int, depth: int, rng) -> QuantizedTensor:
    """gguf's own quantization of normal weights where gguf quantizes the format, else random
    blocks with finite float16 scales of either sign."""
    if format in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4"):
        return weight_source(format, rng.standard_normal((rows, depth)).astype(np.float32))
    row = FORMATS[format]
    blocks = rng.integers(0, 256, (rows * depth // row.block_size, row.block_bytes),
                          dtype=np.uint8)
    for offset in HALF_FIELDS[format]:
        halves = (rng.uniform(0.5, 2.0, blocks.shape[0]) * 2.0 ** -9).astype(np.float16)
        halves *= np.where(rng.random(blocks.shape[0]) < 0.5, -1, 1).astype(np.float16)
        blocks[:, offset:offset + 2] = halves.view(np.uint8).reshape(-1, 2)
    return QuantizedTensor(format, blocks.reshape(rows, -1), (rows, depth))


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


def k_low_parameters(weight: QuantizedTensor):
    """q2_k / q3_k straight from the blocks' bytes: d and the minimums' scale -dmin (q3_k: 0)
    float32 [N, K / 256], and the integer sub-scales and q2_k's sub-minimums int64 [N, K / 16]
    (q3_k's are its 6-bit scales minus 32, its minimums 0)."""
    columns, depth = weight.shape
    blocks = weight.data.reshape(columns, depth // 256, -1)

    def half(offset):
        return blocks[..., offset:offset + 2].copy().view(np.float16)[..., 0].astype(np.float32)

    if weight.format == "q2_k":
        packed = blocks[..., :16].astype(np.int64)
        return (half(80), -half(82), (packed & 15).reshape(columns, -1),
                (packed >> 4).reshape(columns, -1))
    packed = blocks[..., 96:108].astype(np.int64)
    sub = np.arange(16)
    low = (packed[..., sub % 8] >> (4 * (sub // 8))) & 15
    high = (packed[..., 8 + sub % 4] >> (2 * (sub // 4))) & 3
    scales = (low | high << 4) - 32
    return (half(108), np.zeros_like(half(108)), scales.reshape(columns, -1),
            np.zeros_like(scales).reshape(columns, -1))


def k_low_reference(q_blocks, scale, weight, signed) -> np.ndarray:
    """The q2_k / q3_k kernel's formula: per block of 32, I = s0 isum0 + s1 isum1 over its two
    halves and (q2_k) M = m0 sum(q, 0..15) + m1 sum(q, 16..31), exact integers, then
    acc = acc + ((d_w * d_x) * I + (-dmin_w * d_x) * M), one float32 rounding per step."""
    d, second, sub_scales, sub_minimums = k_low_parameters(weight)
    rows, blocks = q_blocks.shape[:2]
    acc = np.zeros((rows, weight.shape[0]), np.float32)
    for b in range(blocks):
        halves = [q_blocks[:, b, h:h + 16] @ signed[:, b, h:h + 16].T for h in (0, 16)]
        sums = [q_blocks[:, b, h:h + 16].sum(-1) for h in (0, 16)]
        total = sub_scales[None, :, 2 * b] * halves[0] + sub_scales[None, :, 2 * b + 1] * halves[1]
        minimums = (sub_minimums[None, :, 2 * b] * sums[0][:, None]
                    + sub_minimums[None, :, 2 * b + 1] * sums[1][:, None])
        assert np.abs(total).max() < 2**24 and np.abs(minimums).max() < 2**24  # exact in float
        term = (d[None, :, b // 8] * scale[:, b, None]) * total.astype(np.float32)
        if weight.format == "q2_k":
            term = term + (second[None, :, b // 8] * scale[:, b, None]) * minimums.astype(
                np.float32)
        acc = acc + term
    return acc


def dot_reference(x: np.ndarray, weight: QuantizedTensor, bias=None,
                  quantized=None) -> np.ndarray:
    """The kernel's formula in numpy: for each block of 32 in order, acc = acc +
    (s_w * d_x) * isum, plus m_w * (d_x * sum q) for formats with a minimum, or for q6_k the
    two halves' (s_w * d_x) * isum; one float32 rounding per step; then + bias."""
    q, scale, scaled_sum, _ = quantized or quantize_reference(x)
    fields = weight.row.block_fields(weight.data, weight.shape[1])
    rows, depth = x.shape
    columns, blocks = weight.shape[0], depth // 32
    signed = (fields.codes.astype(np.int64) - fields.offset).reshape(columns, blocks, 32)
    scales = fields.scales.reshape(columns, blocks, -1)  # one scale per 32, two for q6_k
    q_blocks = q.reshape(rows, depth // 32, 32).astype(np.int64)
    if weight.format in K_LOW_FORMATS:
        acc = k_low_reference(q_blocks, scale, weight, signed)
        return acc if bias is None else acc + bias
    acc = np.zeros((rows, columns), np.float32)
    for b in range(blocks):
        if weight.format == "q6_k":
            halves = [(q_blocks[:, b, h:h + 16] @ signed[:, b, h:h + 16].T).astype(np.float32)
                      for h in (0, 16)]
            term = ((scales[None, :, b, 0] * scale[:, b, None]) * halves[0]
                    + (scales[None, :, b, 1] * scale[:, b, None]) * halves[1])
        else:
            isum = (q_blocks[:, b] @ signed[:, b].T).astype(np.float32)  # exact: below 2^24
            term = (scales[None, :, b, 0] * scale[:, b, None]) * isum
            if fields.minimums is not None:
                term = term + fields.minimums[None, :, b] * scaled_sum[:, b, None]
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
    weight = quantized_weight(format, 37, 256, rng)  # 37 columns: a partial group of 16
    packed = cpu.pack_matrix(weight, layout="dot")
    bias = rng.standard_normal(37).astype(np.float32)
    for rows in (1, 3, 9):
        x = awkward_rows(rng, rows, 256)
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
    weight = quantized_weight(format, 300, 768, rng)
    x = rng.standard_normal((8, 768)).astype(np.float32)
    exact = x.astype(np.float64) @ exact_values(weight).T
    out = cpu.matmul(x, cpu.pack_matrix(weight, layout="dot"))
    relative = np.abs(out - exact).max() / np.abs(exact).max()
    typical = np.sqrt(np.mean((out - exact) ** 2) / np.mean(exact**2))
    record_property("max_relative_error", float(relative))
    record_property("rms_relative_error", float(typical))
    assert relative < 3e-2 and typical < 1e-2
    if FORMATS[format].float_kernel:
        float_path = cpu.matmul(x, cpu.pack_matrix(weight))  # float activations: far closer
        assert np.abs(float_path - exact).max() / np.abs(exact).max() < 1e-5 < relative


# -- row invariance ----------------------------------------------------------------------------

@pytest.mark.parametrize("format", BLOCK_FORMATS)
@pytest.mark.parametrize("threads", (1, 2))
def test_dot_matmul_row_invariance(level, format, threads, restore_threads):
    # 517 x 320 puts even M = 1 on the thread pool (N * K above its threshold).
    cpu.set_num_threads(threads)
    rng = np.random.default_rng(24)
    packed = cpu.pack_matrix(quantized_weight(format, 517, 512, rng), layout="dot")
    bias = rng.standard_normal(517).astype(np.float32)
    for rows in ROW_COUNTS:
        x = awkward_rows(rng, rows, 512)
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
    depth = FORMATS[format].block_size * 2 if FORMATS[format].block_size > 32 else 64
    weight = quantized_weight(format, 37, depth, np.random.default_rng(28))
    packed = cpu.pack_matrix(weight, layout="dot")
    assert packed.layout == "dot" and packed.shape == (37, depth)
    record_bytes = {code: dot for code, _, _, _, _, dot in cpu.format_table()}
    assert packed.data.shape == (3, depth // 32 * record_bytes[FORMATS[format].kernel])
    with pytest.raises(ValueError, match="dot layout needs"):
        cpu.pack_matrix(np.zeros((16, 64), np.float32), layout="dot")


# -- larger shapes -----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("format", BLOCK_FORMATS)
@pytest.mark.parametrize("depth,columns", [(768, 1536), (1536, 768)])
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


@pytest.mark.parametrize("format", K_LOW_FORMATS)
def test_k_low_reference_sees_the_sub_scales_order(format):
    """Negative control: applying q2_k / q3_k's sub-scales in float (d * sc, as dequantization
    forms the weights) instead of to the exact integer sums gives other bits than the kernel
    somewhere, so the bitwise comparison above can tell the two apart."""
    rng = np.random.default_rng(28)
    weight = quantized_weight(format, 40, 512, rng)
    x = awkward_rows(rng, 6, 512)
    q, scale, scaled_sum, _ = quantize_reference(x)
    fields = weight.row.block_fields(weight.data, 512)
    signed = (fields.codes.astype(np.int64) - fields.offset).reshape(40, 16, 32)
    q_blocks = q.reshape(6, 16, 32).astype(np.int64)
    acc = np.zeros((6, 40), np.float32)
    for b in range(16):  # float sub-scales: (d sc) * d_x per half, as q6_k's halves
        for h in (0, 1):
            isum = (q_blocks[:, b, 16 * h:16 * h + 16] @ signed[:, b, 16 * h:16 * h + 16].T)
            acc = acc + (fields.scales[None, :, 2 * b + h] * scale[:, b, None]) * isum.astype(
                np.float32)
            if fields.minimums is not None:
                sums = q_blocks[:, b, 16 * h:16 * h + 16].sum(-1).astype(np.float32)
                scaled = scale[:, b, None] * sums[:, None]
                acc = acc + fields.minimums[None, :, 2 * b + h] * scaled
    kernel = cpu.matmul(x, cpu.pack_matrix(weight, layout="dot"))
    assert np.array_equal(bits(kernel), bits(dot_reference(x, weight)))
    assert not np.array_equal(bits(kernel), bits(acc))
    assert np.allclose(kernel, acc, rtol=1e-3, atol=1e-3 * np.abs(acc).max())  # same product


def test_k_low_records_keep_the_file_size():
    """q2_k and q3_k stay in their blocks: the dot records of whole groups of 16 rows take the
    file's bytes (q2_k) or 3.6 % more (q3_k: its 6-bit scales as bytes), not float32's."""
    rng = np.random.default_rng(29)
    for format, ratio in (("q2_k", 1.0), ("q3_k", 228 / 220)):
        weight = quantized_weight(format, 64, 1024, rng)
        packed = cpu.pack_matrix(weight, layout="dot")
        assert packed.data.nbytes == pytest.approx(ratio * weight.data.nbytes)
        assert packed.data.nbytes < 1.1 * weight.data.nbytes < 64 * 1024 * 4 / 8
