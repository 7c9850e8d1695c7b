"""The Metal shaders in csrc/metal: accuracy against MLX CPU and float64, and bitwise row
invariance with negative controls. Every test runs on the emulator here and on the real Metal
device where MLX has one (skipped elsewhere, with the reason). The emulator itself is tested in
test_metal_emulator.py; the helpers below are shared with it."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.kernels.metal import MetalShaderError, MetalShaders, metal_available

mx = pytest.importorskip("mlx.core")

NO_METAL = "Metal engine: MLX has no Metal device here (mx.metal.is_available() is False)"


@pytest.fixture(scope="session")
def emulator_cache(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("metal-emulator") if cache else tmp_path_factory.mktemp("metal-emulator")


@pytest.fixture(scope="module", params=["emulator", "metal"])
def shaders(request, emulator_cache):
    if request.param == "metal" and not metal_available():
        pytest.skip(NO_METAL)
    return MetalShaders(request.param, cache_dir=emulator_cache)


def host(value) -> np.ndarray:
    return np.asarray(value)


def rows_pool(rng, count: int, width: int) -> np.ndarray:
    """Rows of normal values, each scaled by a power of ten from 1e-4 to 1e4."""
    scales = 10.0 ** rng.uniform(-4, 4, (count, 1))
    return (rng.standard_normal((count, width)) * scales).astype(np.float32)


def row_mismatches(compute, rows: np.ndarray, counts=range(1, 17), seed: int = 0) -> list:
    """(M, position, row) for every row whose bits in an M-row pass differ from its bits alone;
    each pass takes M rows of the pool in a fresh random order."""
    order_rng = np.random.default_rng(seed)
    solo = [host(compute(rows[i:i + 1])).view(np.uint32)[0] for i in range(len(rows))]
    found = []
    for m in counts:
        order = order_rng.permutation(len(rows))[:m] if m <= len(rows) else \
            order_rng.integers(0, len(rows), m)
        out = host(compute(rows[order])).view(np.uint32)
        found += [(m, p, int(i)) for p, i in enumerate(order)
                  if not np.array_equal(out[p], solo[i])]
    return found


def close(actual, expected, tolerance: float) -> None:
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = np.abs(expected).max() + 1e-30
    assert np.abs(actual - expected).max() <= tolerance * scale


def weights(rng, n: int, k: int, dtype: str):
    return mx.array(rng.standard_normal((n, k)).astype(np.float32)).astype(getattr(mx, dtype))


# ---- matmul -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_matmul_matches_mlx_and_float64(shaders, dtype):
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((7, 200)).astype(np.float32), weights(rng, 19, 200, dtype)
    out = host(shaders.matmul(x, w))
    w64 = np.asarray(w.astype(mx.float32), np.float64)
    close(out, x.astype(np.float64) @ w64.T, 1e-6)
    close(out, np.asarray(mx.matmul(mx.array(x), w.astype(mx.float32).T)), 1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_matmul_rows_are_invariant(shaders, dtype):
    rng = np.random.default_rng(2)
    w = weights(rng, 40, 260, dtype)
    assert row_mismatches(lambda xs: shaders.matmul(xs, w), rows_pool(rng, 16, 260)) == []


def test_numpy_matmul_breaks_row_invariance():
    """Negative control: OpenBLAS's plain x @ W.T changes a row's bits with the row count."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((256, 1024)).astype(np.float32)
    assert row_mismatches(lambda xs: xs @ w.T, rows_pool(rng, 16, 1024)) != []




# ---- quantized matmul ---------------------------------------------------------------------

def quantized(rng, n: int, k: int, group_size: int, bits: int, dtype: str = "float32"):
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32)).astype(getattr(mx, dtype))
    return mx.quantize(w, group_size=group_size, bits=bits)


@pytest.mark.parametrize("bits,group_size,dtype", [(4, 32, "float32"), (4, 64, "bfloat16"),
                                                   (8, 32, "float16"), (8, 64, "float32")])
def test_quantized_matmul_matches_mlx_and_float64(shaders, bits, group_size, dtype):
    rng = np.random.default_rng(5)
    wq, scales, biases = quantized(rng, 20, 320, group_size, bits, dtype)
    x = rng.standard_normal((6, 320)).astype(np.float32)
    out = host(shaders.quantized_matmul(x, wq, scales, biases, group_size, bits))
    packed = np.asarray(wq)
    codes = np.stack([(packed >> (bits * i)) & ((1 << bits) - 1) for i in range(32 // bits)], -1)
    s64 = np.asarray(scales.astype(mx.float32), np.float64)[..., None]
    b64 = np.asarray(biases.astype(mx.float32), np.float64)[..., None]
    dense = (codes.reshape(20, -1, group_size) * s64 + b64).reshape(20, 320)
    close(out, x.astype(np.float64) @ dense.T, 1e-6)
    reference = mx.quantized_matmul(mx.array(x), wq, scales.astype(mx.float32),
                                    biases.astype(mx.float32), transpose=True,
                                    group_size=group_size, bits=bits)
    close(out, np.asarray(reference), 1e-5)


@pytest.mark.parametrize("bits,group_size", [(4, 32), (4, 64), (8, 32), (8, 64)])
def test_quantized_matmul_rows_are_invariant(shaders, bits, group_size):
    rng = np.random.default_rng(6)
    wq, scales, biases = quantized(rng, 24, 256, group_size, bits)
    rows = rows_pool(rng, 16, 256)
    assert row_mismatches(
        lambda xs: shaders.quantized_matmul(xs, wq, scales, biases, group_size, bits), rows) == []


def test_quantized_matmul_rejects_bad_layout(shaders):
    rng = np.random.default_rng(7)
    wq, scales, biases = quantized(rng, 8, 128, 64, 4)
    with pytest.raises(MetalShaderError, match="bits=3"):
        shaders.quantized_matmul(np.zeros((1, 128), np.float32), wq, scales, biases, 64, 3)
    with pytest.raises(MetalShaderError, match="K=96"):
        shaders.quantized_matmul(np.zeros((1, 96), np.float32), wq, scales, biases, 64, 4)


# ---- rms_norm and softmax -----------------------------------------------------------------

def test_rms_norm_matches_mlx_and_float64(shaders):
    rng = np.random.default_rng(8)
    x, w = rows_pool(rng, 5, 700), rng.standard_normal(700).astype(np.float32)
    out = host(shaders.rms_norm(x, w, 1e-5))
    x64 = x.astype(np.float64)
    expected = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5) * w
    close(out, expected, 1e-6)
    close(out, np.asarray(mx.fast.rms_norm(mx.array(x), mx.array(w), 1e-5)), 1e-6)


def test_rms_norm_rows_are_invariant(shaders):
    rng = np.random.default_rng(9)
    w = rng.standard_normal(300).astype(np.float32)
    compute = lambda xs: shaders.rms_norm(xs, w, 1e-6)  # noqa: E731
    assert row_mismatches(compute, rows_pool(rng, 16, 300)) == []


def test_softmax_matches_mlx_and_float64(shaders):
    rng = np.random.default_rng(10)
    x = (rng.standard_normal((6, 1000)) * 4).astype(np.float32)
    x[0, :500] = -np.inf  # masked logits
    out = host(shaders.softmax(x))
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    close(out, e / e.sum(-1, keepdims=True), 1e-6)
    close(out, np.asarray(mx.softmax(mx.array(x), axis=-1)), 1e-6)


def test_softmax_rows_are_invariant(shaders):
    rng = np.random.default_rng(11)
    scales = 10.0 ** rng.uniform(-2, 1.5, (16, 1))
    rows = (rng.standard_normal((16, 300)) * scales).astype(np.float32)
    assert row_mismatches(shaders.softmax, rows) == []


# Negative controls: the same comparisons on shaders whose reduction follows the row count.
# Each is the shipped shader with one change: when the pass has more than two rows, only
# half of the threadgroup's threads stride over the row (an occupancy tuning by M, which
# SUBSET.md forbids), so a row's partial sums, and its bits, change with M.

ROW_COUNT_TUNED = {
    "rms_norm.metal": ("for (int k = t; k < K; k += THREADS) {\n  const float v",
                       "const int STRIDE = x_shape[0] > 2 ? THREADS / 2 : THREADS;\n"
                       "for (int k = t; t < STRIDE && k < K; k += STRIDE) {\n  const float v"),
    "softmax.metal": ("for (int n = t; n < N; n += THREADS) sum = sum",
                      "const int STRIDE = x_shape[0] > 2 ? THREADS / 2 : THREADS;\n"
                      "for (int n = t; t < STRIDE && n < N; n += STRIDE) sum = sum"),
}


@pytest.fixture(scope="module")
def row_count_tuned_shaders(tmp_path_factory, emulator_cache):
    import shutil

    from exactdraft.kernels.metal import SOURCE_DIR

    sources = tmp_path_factory.mktemp("metal") / "metal"
    shutil.copytree(SOURCE_DIR, sources)
    for name, (shipped, tuned) in ROW_COUNT_TUNED.items():
        body = (sources / name).read_text()
        assert body.count(shipped) == 1, name
        (sources / name).write_text(body.replace(shipped, tuned))
    return MetalShaders("emulator", cache_dir=emulator_cache, source_dir=sources)


def test_negative_control_row_count_tuned_rms_norm(row_count_tuned_shaders):
    rng = np.random.default_rng(9)
    w = rng.standard_normal(300).astype(np.float32)
    rows = rows_pool(rng, 16, 300)
    tuned = row_count_tuned_shaders.rms_norm
    # Still an rms_norm, to float32 accuracy; only its bits follow the row count.
    x64 = rows[:5].astype(np.float64)
    close(host(tuned(rows[:5], w, 1e-6)),
          x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-6) * w, 1e-6)
    assert row_mismatches(lambda xs: tuned(xs, w, 1e-6), rows) != []


def test_negative_control_row_count_tuned_softmax(row_count_tuned_shaders):
    rng = np.random.default_rng(11)
    scales = 10.0 ** rng.uniform(-2, 1.5, (16, 1))
    rows = (rng.standard_normal((16, 300)) * scales).astype(np.float32)
    tuned = row_count_tuned_shaders.softmax
    x64 = rows[:5].astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    close(host(tuned(rows[:5])), e / e.sum(-1, keepdims=True), 1e-6)
    assert row_mismatches(tuned, rows) != []


# ---- attention ----------------------------------------------------------------------------

HEADS, KV_HEADS, HEAD_DIM, CAPACITY = 4, 2, 64, 256
POSITIONS = np.array([0, 1, 5, 62, 63, 64, 65, 100, 127, 128, 129, 150, 191, 192, 200, 255])


def attention_case(rng, dtype: str):
    q = rng.standard_normal((len(POSITIONS), HEADS, HEAD_DIM)).astype(np.float32)
    kv = rng.standard_normal((2, KV_HEADS, CAPACITY, HEAD_DIM)).astype(np.float32) * 2
    keys, values = (mx.array(a).astype(getattr(mx, dtype)) for a in kv)
    return q, keys, values


def attention_float64(q, keys, values, positions, window, scale):
    k64 = np.asarray(keys.astype(mx.float32), np.float64)
    v64 = np.asarray(values.astype(mx.float32), np.float64)
    out = np.zeros(q.shape)
    group = q.shape[1] // k64.shape[0]
    for m, p in enumerate(positions):
        lo = max(0, p - window + 1) if window > 0 else 0
        for h in range(q.shape[1]):
            scores = k64[h // group, lo:p + 1] @ q[m, h].astype(np.float64) * scale
            e = np.exp(scores - scores.max())
            out[m, h] = e @ v64[h // group, lo:p + 1] / e.sum()
    return out


@pytest.mark.parametrize("dtype,window", [("float32", 0), ("bfloat16", 0), ("float16", 50)])
def test_attention_matches_mlx_and_float64(shaders, dtype, window):
    rng = np.random.default_rng(12)
    q, keys, values = attention_case(rng, dtype)
    scale = HEAD_DIM ** -0.5
    out = host(shaders.attention(q, keys, values, POSITIONS, window, scale))
    close(out, attention_float64(q, keys, values, POSITIONS, window, scale), 1e-5)
    j, p = np.arange(CAPACITY)[None, :], POSITIONS[:, None]
    visible = (j <= p) & ((p - j < window) if window else True)
    mask = mx.array(np.where(visible, 0.0, -np.inf).astype(np.float32))
    reference = mx.fast.scaled_dot_product_attention(
        mx.array(q.transpose(1, 0, 2))[None], keys.astype(mx.float32)[None],
        values.astype(mx.float32)[None], scale=scale, mask=mask)
    close(out, np.asarray(reference[0]).transpose(1, 0, 2), 1e-5)


@pytest.mark.parametrize("dtype,window", [("float32", 0), ("float32", 64), ("bfloat16", 0),
                                          ("float16", 100)])
def test_attention_rows_are_invariant(shaders, dtype, window):
    """A row computed alone, over a buffer that ends at its own chunk and holds NaN after its
    position, has the bits it has in any pass over the full buffer."""
    rng = np.random.default_rng(13)
    q, keys, values = attention_case(rng, dtype)
    solo = {}
    for i, p in enumerate(POSITIONS):
        capacity = (p // 64 + 1) * 64
        garbage = np.arange(capacity)[None, :, None] > p
        short = [mx.where(mx.array(garbage), mx.array(np.nan, c.dtype), c[:, :capacity])
                 for c in (keys, values)]
        result = shaders.attention(q[i:i + 1], *short, POSITIONS[i:i + 1], window, 0.125)
        solo[i] = host(result).view(np.uint32)[0]
    order_rng, failures = np.random.default_rng(0), []
    for m in list(range(1, 17)):
        order = order_rng.permutation(len(POSITIONS))[:m]
        out = host(shaders.attention(q[order], keys, values, POSITIONS[order], window, 0.125))
        failures += [(m, i) for r, i in enumerate(order)
                     if not np.array_equal(out[r].view(np.uint32), solo[i])]
    assert failures == []


def test_attention_window_beyond_position_equals_no_window(shaders):
    rng = np.random.default_rng(14)
    q, keys, values = attention_case(rng, "float32")
    plain = host(shaders.attention(q, keys, values, POSITIONS, 0, 0.125))
    wide = host(shaders.attention(q, keys, values, POSITIONS, 1000, 0.125))
    assert np.array_equal(plain.view(np.uint32), wide.view(np.uint32))
    narrow = host(shaders.attention(q, keys, values, POSITIONS, 10, 0.125))
    assert not np.array_equal(plain, narrow)


def test_attention_rejects_bad_positions(shaders):
    rng = np.random.default_rng(15)
    q, keys, values = attention_case(rng, "float32")
    with pytest.raises(MetalShaderError, match="capacity 256"):
        shaders.attention(q[:1], keys, values, [256], 0, 0.125)


def test_plain_numpy_attention_breaks_row_invariance():
    """Negative control for the attention tests: masked softmax(q K^T) V with numpy's matmul
    changes a query row's bits with the number of rows in the pass."""
    rng = np.random.default_rng(16)
    keys, values = (rng.standard_normal((CAPACITY, HEAD_DIM)).astype(np.float32) for _ in "kv")
    rows = rng.standard_normal((16, HEAD_DIM)).astype(np.float32)
    visible = np.arange(CAPACITY)[None, :] <= POSITIONS[:, None]
    position_of = {row.tobytes(): p for row, p in zip(rows, visible, strict=True)}

    def compute(queries):
        scores = np.where(np.stack([position_of[r.tobytes()] for r in queries]),
                          (queries @ keys.T) * np.float32(0.125), -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        return (weights / weights.sum(-1, keepdims=True)) @ values
    assert row_mismatches(compute, rows) != []


# ---- larger shapes ------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_large_rows_are_invariant(shaders, dtype):
    rng = np.random.default_rng(20)
    w = weights(rng, 136, 1100, dtype)
    counts = [1, 2, 3, 4, 5, 8, 9, 16, 31, 33, 48]
    assert row_mismatches(lambda xs: shaders.matmul(xs, w), rows_pool(rng, 48, 1100),
                          counts) == []


@pytest.mark.slow
def test_quantized_matmul_large_rows_are_invariant(shaders):
    rng = np.random.default_rng(21)
    wq, scales, biases = quantized(rng, 72, 2048, 64, 4, "bfloat16")
    compute = lambda xs: shaders.quantized_matmul(xs, wq, scales, biases, 64, 4)  # noqa: E731
    assert row_mismatches(compute, rows_pool(rng, 40, 2048), [1, 3, 4, 7, 17, 33, 40]) == []


@pytest.mark.slow
def test_attention_long_cache_head_dim_128(shaders):
    rng = np.random.default_rng(22)
    positions = np.array([0, 300, 511, 512, 700, 1023, 64, 900])
    q = rng.standard_normal((8, 8, 128)).astype(np.float32)
    keys, values = (mx.array(rng.standard_normal((2, 1024, 128)).astype(np.float32))
                    .astype(mx.bfloat16) for _ in range(2))
    full = host(shaders.attention(q, keys, values, positions, 256, 128 ** -0.5))
    close(full, attention_float64(q, keys, values, positions, 256, 128 ** -0.5), 1e-5)
    for i in range(8):
        alone = host(shaders.attention(q[i:i + 1], keys, values, positions[i:i + 1], 256,
                                       128 ** -0.5))
        assert np.array_equal(alone[0].view(np.uint32), full[i].view(np.uint32))
