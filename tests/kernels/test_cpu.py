"""Tests of the C CPU kernels: accuracy against float64 (gguf's own dequantization for the block
formats) and bitwise row invariance on every SIMD level this CPU runs, with 1 and 2 threads.

Each invariance property has a negative control showing that the plain torch op breaks it on
this machine, so the comparison can fail.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from exactdraft.formats import QuantizedTensor
from exactdraft.kernels import cpu
from tests.kernels.conftest import assert_rows_match_alone, bits

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

FORMATS = ("f32", "bf16", "q8_0", "q4_0", "q4_1")
ROW_COUNTS = (*range(1, 17), 31, 33, 67)  # straddle the 4-row tiles and 32-row blocks


def weight_source(format: str, dense: np.ndarray):
    """`dense` in `format`: float32, bfloat16 bit patterns or a QuantizedTensor (via gguf)."""
    if format == "f32":
        return dense
    if format == "bf16":
        return (dense.view(np.uint32) >> 16).astype(np.uint16)
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    blocks = quantize(dense, getattr(GGMLQuantizationType, format.upper()))
    return QuantizedTensor(format, blocks, dense.shape)


def exact_values(source) -> np.ndarray:
    """The float64 values of a weight source: gguf's own dequantization for block formats."""
    if isinstance(source, QuantizedTensor):
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        kind = getattr(GGMLQuantizationType, source.format.upper())
        if source.format == "q1_0":  # gguf reads no q1_0: the format table's (its own tests')
            return source.dequantize().astype(np.float64)
        return dequantize(source.data, kind).astype(np.float64)
    if source.dtype == np.uint16:
        return (source.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return source.astype(np.float64)


def make_weight(format: str, rows: int, depth: int, rng,
                layout: str = "grouped") -> tuple[cpu.PackedMatrix, np.ndarray]:
    """A packed random weight and its exact values in float64."""
    source = weight_source(format, rng.standard_normal((rows, depth)).astype(np.float32))
    packed = cpu.pack_matrix(source, "bf16" if format == "bf16" else None, layout=layout)
    return packed, exact_values(source)


def matmul_tolerance(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The classic float32 dot-product bound K * 2^-24 * sum |x w|, plus bias rounding."""
    depth = x.shape[1]
    return (depth + 2) * 2.0**-24 * (np.abs(x.astype(np.float64)) @ np.abs(weight).T) + 1e-30


# -- matmul ------------------------------------------------------------------------------------

@pytest.mark.parametrize("format", FORMATS)
def test_matmul_accuracy(level, format):
    rng = np.random.default_rng(1)
    depth = 96 if format.startswith("q") else 100  # dense depth leaves a partial vector
    packed, exact = make_weight(format, 13, depth, rng)
    x = rng.standard_normal((5, depth)).astype(np.float32)
    bias = rng.standard_normal(13).astype(np.float32)
    out = cpu.matmul(x, packed, bias)
    reference = x.astype(np.float64) @ exact.T + bias
    assert out.dtype == np.float32 and out.shape == (5, 13)
    assert np.all(np.abs(out - reference) <= matmul_tolerance(x, exact) + 2.0**-24 * abs(bias))


@pytest.mark.parametrize("format,depth", [*((f, 288) for f in FORMATS), ("f32", 300),
                                          ("bf16", 300)])  # 300: plain rows with a K tail
@pytest.mark.parametrize("threads", (1, 2))
def test_matmul_row_invariance(level, format, depth, threads, restore_threads):
    # M = 1 already runs on the thread pool at this size (N * K above its threshold).
    cpu.set_num_threads(threads)
    rng = np.random.default_rng(2)
    packed, _ = make_weight(format, 517, depth, rng)
    assert packed.layout == ("grouped" if depth % 32 == 0 else "rows")
    bias = rng.standard_normal(517).astype(np.float32)
    for rows in ROW_COUNTS:
        x = rng.standard_normal((rows, depth)).astype(np.float32)
        x[rows // 2] *= 1e-20  # tiny and large magnitudes in the same pass
        x[0] *= 1e15
        assert_rows_match_alone(x, packed, bias)


@pytest.mark.parametrize("format", FORMATS)
def test_matmul_same_bits_for_every_thread_count(format, restore_threads):
    rng = np.random.default_rng(3)
    packed, _ = make_weight(format, 700, 256, rng)
    x = rng.standard_normal((9, 256)).astype(np.float32)
    results = []
    for threads in (1, 2, 3):
        cpu.set_num_threads(threads)
        results.append(bits(cpu.matmul(x, packed)))
    assert all(np.array_equal(results[0], other) for other in results[1:])


def test_negative_control_torch_matmul_changes_bits_with_the_thread_count():
    """The comparison of test_matmul_same_bits_for_every_thread_count, on torch's `x @ W.T`
    (MKL splits the work by thread count and the bits follow)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    weight = torch.from_numpy(rng.standard_normal((700, 256)).astype(np.float32))
    default = torch.get_num_threads()
    results = {}
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for rows in (1, 2, 3, 9, 33):
                x = torch.from_numpy(np.random.default_rng(rows).standard_normal(
                    (rows, 256)).astype(np.float32))
                results.setdefault(rows, []).append(bits((x @ weight.T).numpy()))
    finally:
        torch.set_num_threads(default)
    differing = [rows for rows, outs in results.items()
                 if not all(np.array_equal(outs[0], other) for other in outs[1:])]
    if not differing:
        pytest.skip("torch's matmul gave the same bits with 1, 2 and 3 threads on this machine "
                    "(measured at M = 1, 2, 3, 9, 33), so it is no wrong implementation here")
    assert differing


def test_unpadded_torch_matmul_breaks_row_invariance():
    """Negative control: torch's plain `x @ W` gives rows other bits when M changes."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 517, generator=generator)
    broken = 0
    for rows in range(2, 17):
        x = torch.randn(rows, 300, generator=generator)
        together = x @ weight
        broken += sum(not torch.equal(together[r], (x[r:r + 1] @ weight)[0]) for r in range(rows))
    assert broken > 0


def test_matmul_accepts_torch_tensors_without_copies():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    weight = torch.from_numpy(rng.standard_normal((40, 64)).astype(np.float32))
    packed = cpu.pack_matrix(weight, layout="rows")
    assert packed.data.data_ptr() == weight.data_ptr()
    x = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32))
    out = cpu.matmul(x, packed)
    assert isinstance(out, torch.Tensor)
    assert np.array_equal(bits(out.numpy()), bits(cpu.matmul(x.numpy(), weight.numpy())))
    bf16 = weight.to(torch.bfloat16)
    expected = bits(cpu.matmul(x.numpy(), bf16.float().numpy()))
    for layout in ("rows", "grouped"):
        packed = cpu.pack_matrix(bf16, layout=layout)
        assert np.array_equal(bits(cpu.matmul(x, packed).numpy()), expected)


@pytest.mark.parametrize("format", FORMATS)
def test_grouped_layout_gives_the_same_bits_as_rows(level, format):
    rng = np.random.default_rng(5)
    source = weight_source(format, rng.standard_normal((39, 96)).astype(np.float32))
    hint = "bf16" if format == "bf16" else None
    grouped = cpu.pack_matrix(source, hint)  # 39 rows: the last group holds 3
    rows = cpu.pack_matrix(source, hint, layout="rows")
    assert (grouped.layout, rows.layout) == ("grouped", "rows")
    assert grouped.data.nbytes == rows.data.nbytes
    x = rng.standard_normal((6, 96)).astype(np.float32)
    assert np.array_equal(bits(cpu.matmul(x, grouped)), bits(cpu.matmul(x, rows)))


def test_rows_layout_uses_the_quantized_blocks_in_place():
    blocks = np.zeros((8, 40), np.uint8)
    packed = cpu.pack_matrix(QuantizedTensor("q4_1", blocks, (8, 64)), layout="rows")
    assert packed.data is blocks and packed.format == "q4_1"


# -- attention ---------------------------------------------------------------------------------

def attention_reference(q, keys, values, positions, window, scale):
    rows, heads, _ = q.shape
    group = heads // keys.shape[0]
    out = np.zeros(q.shape)
    for m, position in enumerate(positions):
        first = max(0, position - window + 1) if window > 0 else 0
        for h in range(heads):
            k = keys[h // group, first:position + 1].astype(np.float64)
            v = values[h // group, first:position + 1].astype(np.float64)
            scores = k @ q[m, h].astype(np.float64) * scale
            weights = np.exp(scores - scores.max())
            out[m, h] = weights @ v / weights.sum()
    return out


def kv_buffers(rng, kv_heads, capacity, head_dim):
    return (rng.standard_normal((kv_heads, capacity, head_dim)).astype(np.float32),
            rng.standard_normal((kv_heads, capacity, head_dim)).astype(np.float32))


@pytest.mark.parametrize("head_dim,window", [(64, 0), (64, 50), (40, 0), (128, 70)])
def test_attention_accuracy(level, head_dim, window):
    rng = np.random.default_rng(6)
    keys, values = kv_buffers(rng, 2, 200, head_dim)
    q = rng.standard_normal((5, 6, head_dim)).astype(np.float32)
    positions = np.array([0, 63, 64, 130, 199])
    out = cpu.attention(q, keys, values, positions, window, head_dim**-0.5)
    reference = attention_reference(q, keys, values, positions, window, head_dim**-0.5)
    assert np.abs(out - reference).max() < 2e-6


@pytest.mark.parametrize("window", (0, 50, 64))
@pytest.mark.parametrize("threads", (1, 2))
@pytest.mark.parametrize("head_dim", (40, 64, 128))  # the general kernel and both fixed sizes
def test_attention_row_invariance(level, window, threads, head_dim, restore_threads):
    """A row's bits depend on its position and the keys up to it, never on the other rows,
    how many there are (which decides the row blocks that take turns on a key tile), the
    buffer's capacity or the thread count."""
    cpu.set_num_threads(threads)
    rng = np.random.default_rng(7)
    keys, values = kv_buffers(rng, 2, 256, head_dim)
    grown_keys, grown_values = kv_buffers(rng, 2, 512, head_dim)  # other contents past 255
    grown_keys[:, :256], grown_values[:, :256] = keys, values
    scale = head_dim**-0.5
    for rows in (*range(1, 17), 70):
        q = rng.standard_normal((rows, 6, head_dim)).astype(np.float32)
        positions = np.sort(rng.choice(256, size=rows, replace=False))
        together = bits(cpu.attention(q, keys, values, positions, window, scale))
        grown = bits(cpu.attention(q, grown_keys, grown_values, positions, window, scale))
        assert np.array_equal(together, grown), rows
        for r in range(rows):
            alone = cpu.attention(q[r:r + 1], keys, values, positions[r:r + 1], window, scale)
            assert np.array_equal(together[r:r + 1], bits(alone)), (rows, r)


def test_attention_chunked_prefill_equals_one_pass():
    rng = np.random.default_rng(8)
    keys, values = kv_buffers(rng, 3, 192, 64)
    q = rng.standard_normal((150, 9, 64)).astype(np.float32)
    positions = np.arange(150)
    whole = bits(cpu.attention(q, keys, values, positions, 0, 0.125))
    cuts = (0, 1, 37, 64, 100, 150)
    chunks = [cpu.attention(q[a:b], keys, values, positions[a:b], 0, 0.125)
              for a, b in zip(cuts, cuts[1:])]
    assert np.array_equal(whole, bits(np.concatenate(chunks)))


@pytest.mark.parametrize("group,head_dim", [(2, 64), (3, 64), (5, 64), (7, 40), (3, 128)])
def test_heads_sharing_a_kv_head_get_the_bits_they_get_alone(level, group, head_dim):
    """Query heads of one KV head are computed side by side; each must get the bits of a
    lone head (the same keys and values given to every head as its own KV head)."""
    rng = np.random.default_rng(16)
    keys, values = kv_buffers(rng, 2, 130, head_dim)
    q = rng.standard_normal((3, 2 * group, head_dim)).astype(np.float32)
    positions = np.array([5, 70, 129])
    shared = bits(cpu.attention(q, keys, values, positions, 0, 0.3))
    alone = bits(cpu.attention(q, np.repeat(keys, group, 0), np.repeat(values, group, 0),
                               positions, 0, 0.3))
    assert np.array_equal(shared, alone)


def test_torch_sdpa_breaks_row_invariance():
    """Negative control: scaled_dot_product_attention gives rows other bits when M changes."""
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    keys = torch.randn(1, 4, 100, 64, generator=generator)
    values = torch.randn(1, 4, 100, 64, generator=generator)
    broken = 0
    for rows in (2, 5, 16):
        q = torch.randn(1, 4, rows, 64, generator=generator)
        positions = torch.arange(100 - rows, 100)
        mask = torch.arange(100)[None, :] <= positions[:, None]
        together = torch.nn.functional.scaled_dot_product_attention(q, keys, values, mask)
        for r in range(rows):
            alone = torch.nn.functional.scaled_dot_product_attention(
                q[:, :, r:r + 1], keys, values, mask[r:r + 1])
            broken += not torch.equal(alone[:, :, 0], together[:, :, r])
    assert broken > 0


def test_negative_control_attention_over_the_whole_buffer_breaks_the_capacity_check():
    """torch's SDPA over every key of the buffer, masked past each row's position (so the
    masked keys get weight zero), reads past the row's position: its bits change with the
    buffer's capacity, which test_attention_row_invariance compares."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    keys, values = kv_buffers(rng, 2, 256, 40)
    grown_keys, grown_values = kv_buffers(rng, 2, 512, 40)
    grown_keys[:, :256], grown_values[:, :256] = keys, values

    def whole_buffer(q, keys, values, positions):
        mask = torch.arange(keys.shape[1])[None, :] <= torch.from_numpy(positions)[:, None]
        k, v = (torch.from_numpy(np.repeat(a, 3, 0)) for a in (keys, values))
        out = torch.nn.functional.scaled_dot_product_attention(
            torch.from_numpy(q).transpose(0, 1), k, v, attn_mask=mask, scale=40**-0.5)
        return out.transpose(0, 1).contiguous().numpy()

    differing = 0
    for rows in (*range(1, 17), 70):
        q = rng.standard_normal((rows, 6, 40)).astype(np.float32)
        positions = np.sort(rng.choice(256, size=rows, replace=False))
        differing += not np.array_equal(bits(whole_buffer(q, keys, values, positions)),
                                        bits(whole_buffer(q, grown_keys, grown_values,
                                                          positions)))
    if differing == 0:
        pytest.skip("torch's SDPA gave the same bits over 256- and 512-key buffers on this "
                    "machine (measured), so it is no wrong implementation here")
    assert differing > 0


def test_attention_rejects_positions_past_the_buffer():
    keys, values = kv_buffers(np.random.default_rng(9), 1, 64, 16)
    q = np.zeros((1, 2, 16), np.float32)
    with pytest.raises(ValueError, match="positions"):
        cpu.attention(q, keys, values, np.array([64]), 0, 1.0)


# -- row-wise and elementwise ops --------------------------------------------------------------

def test_row_ops_accuracy(level):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 200)).astype(np.float32)
    weight = rng.standard_normal(200).astype(np.float32)
    x64 = x.astype(np.float64)
    expected = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * weight
    assert np.abs(cpu.rms_norm(x, weight, 1e-5) - expected).max() < 1e-5
    gate_up = rng.standard_normal((4, 2 * 77)).astype(np.float32) * 8
    gate, up = gate_up[:, :77].astype(np.float64), gate_up[:, 77:].astype(np.float64)
    expected = gate / (1 + np.exp(-gate)) * up
    assert np.all(np.abs(cpu.silu_mul(gate_up) - expected) <= 4e-7 * np.abs(expected) + 1e-30)


def test_exp_special_values(level):
    gate = np.array([[0.0, -0.0, 100.0, -100.0, 88.0, -88.0, np.inf, -np.inf, np.nan, 1e-30]],
                    np.float32)
    up = np.ones_like(gate)
    out = cpu.silu_mul(np.concatenate([gate, up], axis=1))[0]
    assert out[0] == 0 and out[1] == 0 and out[2] == 100 and out[4] == 88
    assert out[3] == 0 and -1e-30 < out[5] < 0 and out[6] == np.inf
    assert np.isnan(out[7]) and np.isnan(out[8]) and out[9] == np.float32(1e-30) / 2


def test_rope_matches_the_torch_formula_bitwise():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 4, 40)).astype(np.float32)
    cos, sin = (rng.standard_normal((3, 20)).astype(np.float32) for _ in range(2))
    first, second = x[..., :20], x[..., 20:]
    c, s = cos[:, None], sin[:, None]
    expected = np.concatenate([first * c - second * s, second * c + first * s], axis=-1)
    assert np.array_equal(bits(cpu.rope(x, cos, sin)), bits(expected))


ROW_OP_COUNTS = (*range(1, 17), 70, 300)  # 300 rows cross the parallel threshold


def row_op_cases(seed: int = 12):
    """(x [M, 1000], weight, heads [M, 23, 40], cos, sin [M, 20]) for every M of
    ROW_OP_COUNTS. 23 heads of 20 rotated pairs make 460 pairs a row, not a multiple of any
    vector width, so a kernel that vectorises across rows puts a row's pairs in other lanes
    (or in a scalar tail) depending on M."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal(1000).astype(np.float32)
    for rows in ROW_OP_COUNTS:
        x = rng.standard_normal((rows, 1000)).astype(np.float32) * 6
        cos, sin = (rng.standard_normal((rows, 20)).astype(np.float32) for _ in range(2))
        yield x, weight, x[:, :920].reshape(rows, 23, 40).copy(), cos, sin


def rows_differing_alone(compute, *arrays) -> int:
    """How many rows of compute(*arrays) lack the bits compute gives that row alone (every
    array cut to the row)."""
    together = bits(compute(*arrays))
    return sum(not np.array_equal(together[r:r + 1],
                                  bits(compute(*(a[r:r + 1] for a in arrays))))
               for r in range(arrays[0].shape[0]))


ROW_OPS = {
    "rms_norm": lambda x, weight, heads, cos, sin: (lambda x: cpu.rms_norm(x, weight, 1e-6), x),
    "silu_mul": lambda x, weight, heads, cos, sin: (cpu.silu_mul, x),
    "rope": lambda x, weight, heads, cos, sin: (cpu.rope, heads, cos, sin),
}


@pytest.mark.parametrize("threads", (1, 2))
def test_row_ops_invariance(level, threads, restore_threads):
    cpu.set_num_threads(threads)
    for case in row_op_cases():
        for name, op in ROW_OPS.items():
            compute, *arrays = op(*case)
            assert rows_differing_alone(compute, *arrays) == 0, (name, case[0].shape[0])


def numpy_rms_norm_through_blas(x, weight):
    """A plausible wrong rms_norm: the sums of squares as one BLAS product with a ones vector
    (numpy's matmul, OpenBLAS here), whose blocking follows the row count."""
    squares = (x * x) @ np.ones((x.shape[1], 1), np.float32)
    return x / np.sqrt(squares / np.float32(x.shape[1]) + np.float32(1e-6)) * weight


def test_negative_control_rms_norm_through_blas_breaks_the_row_check():
    broken = 0
    for x, weight, *_ in row_op_cases():
        broken += rows_differing_alone(lambda rows, w=weight: numpy_rms_norm_through_blas(rows, w),
                                       x)
    if broken == 0:
        pytest.skip("numpy's BLAS gave every row of (x * x) @ ones the bits it gets alone on "
                    "this machine (measured over the row counts above), so it is no wrong "
                    "implementation here")
    assert broken > 0


def vectorised_across_rows_rope(heads, cos, sin):
    """A plausible wrong rope: one loop over the flattened rows x heads x pairs, 16 pairs at
    a time with fused multiply-adds (x1 * cos kept unrounded, as an FMA keeps it; emulated in
    float64), and a scalar tail for the last pairs that rounds every product. Which pairs
    fall in the tail depends on how many rows the call has."""
    rows, count, dim = heads.shape
    half = dim // 2
    x1 = heads[..., :half].reshape(-1)
    x2 = heads[..., half:].reshape(-1)
    c = np.broadcast_to(cos[:, None, :], (rows, count, half)).reshape(-1)
    s = np.broadcast_to(sin[:, None, :], (rows, count, half)).reshape(-1)
    body = x1.size - x1.size % 16
    first = np.empty_like(x1)
    second = np.empty_like(x2)
    fused = slice(0, body)
    first[fused] = (x1[fused].astype(np.float64) * c[fused] - x2[fused] * s[fused]).astype(
        np.float32)
    second[fused] = (x2[fused].astype(np.float64) * c[fused] + x1[fused] * s[fused]).astype(
        np.float32)
    tail = slice(body, None)
    first[tail] = x1[tail] * c[tail] - x2[tail] * s[tail]
    second[tail] = x2[tail] * c[tail] + x1[tail] * s[tail]
    return np.concatenate([first.reshape(rows, count, half), second.reshape(rows, count, half)],
                          axis=-1)


def test_negative_control_rope_vectorised_across_rows_breaks_the_row_check():
    # The wrong rope computes what cpu.rope computes, to within float32 rounding ...
    x, _, heads, cos, sin = next(row_op_cases(seed=3))
    assert np.allclose(vectorised_across_rows_rope(heads, cos, sin), cpu.rope(heads, cos, sin),
                       rtol=1e-5, atol=1e-5)
    # ... but the row check above sees its bits move with the row count.
    assert sum(rows_differing_alone(vectorised_across_rows_rope, case[2], case[3], case[4])
               for case in row_op_cases()) > 0


def test_silu_bits_do_not_depend_on_the_element_position(level):
    """Every element runs the same vector code: shifting a row shifts its outputs exactly."""
    rng = np.random.default_rng(13)
    gate = rng.standard_normal(101).astype(np.float32) * 10
    for shift in range(1, 20):
        a = cpu.silu_mul(np.concatenate([gate, np.ones(101, np.float32)])[None])[0]
        moved = np.concatenate([gate[shift:], np.ones(101 - shift, np.float32)])[None]
        assert np.array_equal(bits(a[shift:]), bits(cpu.silu_mul(moved)[0]))


def test_torch_sigmoid_breaks_position_independence():
    """Negative control: torch's vectorised sigmoid and its scalar tail round differently."""
    torch = pytest.importorskip("torch")
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    alone = torch.stack([torch.sigmoid(x[i:i + 1])[0] for i in range(1000)])
    assert not torch.equal(torch.sigmoid(x), alone)


# -- argument checks and availability ----------------------------------------------------------

def test_bad_arguments_name_the_argument():
    x = np.zeros((2, 64), np.float32)
    packed = cpu.pack_matrix(np.zeros((8, 64), np.float32))
    with pytest.raises(TypeError, match="x must have dtype float32"):
        cpu.matmul(x.astype(np.float64), packed)
    with pytest.raises(ValueError, match=r"x must have shape \[\*, 64\]"):
        cpu.matmul(np.zeros((2, 63), np.float32), packed)
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        cpu.matmul(np.zeros((64, 2), np.float32).T, packed)
    with pytest.raises(ValueError, match="bias must have shape"):
        cpu.matmul(x, packed, np.zeros(7, np.float32))
    with pytest.raises(ValueError, match="out must not overlap"):
        cpu.matmul(x, packed, out=x.reshape(-1)[:16].reshape(2, 8))
    with pytest.raises(ValueError, match="needs format"):
        cpu.pack_matrix(np.zeros((8, 40), np.uint8))
    with pytest.raises(ValueError, match="multiple of 32"):
        cpu.pack_matrix(np.zeros((8, 40), np.uint8), "q4_1", depth=63)


def test_unavailable_extension_is_reported():
    script = ("import sys; sys.modules['exactdraft._cpu_kernels'] = None\n"
              "from exactdraft.kernels import cpu\n"
              "assert not cpu.available() and 'not built' in cpu.unavailable_reason()\n"
              "try:\n    cpu.simd_level()\nexcept cpu.CpuKernelsUnavailable:\n    print('ok')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=False)
    assert result.stdout.strip() == "ok", result.stderr


def test_benchmark_smoke_run():
    pytest.importorskip("torch")
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_kernels.py"
    spec = importlib.util.spec_from_file_location("cpu_kernels_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    lines = benchmark.run(((64, 32),), ("f32", "q4_1"), None, 1)
    assert len(lines) == 4 and "q4_1" in lines[-1]


# -- larger shapes -----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("format", FORMATS)
@pytest.mark.parametrize("depth,columns", [(576, 1536), (1536, 576)])
def test_matmul_row_invariance_model_shapes(format, depth, columns, restore_threads):
    rng = np.random.default_rng(14)
    packed, exact = make_weight(format, columns, depth, rng)
    for threads in (1, 2):
        cpu.set_num_threads(threads)
        for rows in (*range(1, 17), 64, 129):
            x = rng.standard_normal((rows, depth)).astype(np.float32)
            together = cpu.matmul(x, packed)
            assert np.all(np.abs(together - x @ exact.T) <= matmul_tolerance(x, exact))
            for r in range(rows):
                assert np.array_equal(bits(together[r:r + 1]), bits(cpu.matmul(x[r:r + 1], packed)))


@pytest.mark.slow
def test_attention_row_invariance_long_context(restore_threads):
    rng = np.random.default_rng(15)
    keys, values = kv_buffers(rng, 3, 4096, 64)
    q = rng.standard_normal((16, 9, 64)).astype(np.float32)
    positions = np.arange(4000, 4016)
    for threads in (1, 2):
        cpu.set_num_threads(threads)
        for window in (0, 2048):
            together = bits(cpu.attention(q, keys, values, positions, window, 0.125))
            for r in range(16):
                alone = cpu.attention(q[r:r + 1], keys, values, positions[r:r + 1], window, 0.125)
                assert np.array_equal(together[r:r + 1], bits(alone))
            reference = attention_reference(q[:2], keys, values, positions[:2], window, 0.125)
            assert np.abs(cpu.attention(q[:2], keys, values, positions[:2], window, 0.125)
                          - reference).max() < 2e-6
