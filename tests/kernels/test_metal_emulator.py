"""The C++ emulator that runs the Metal shader bodies off a Mac: the signature text it shares
with MLX, thread-order independence, the SIMD-group built-ins and conversions it defines, and
the constructs outside csrc/metal/SUBSET.md it refuses."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.kernels.metal import MetalShaderError, MetalShaders, ShaderSpec
from exactdraft.kernels.metal_emulator import Emulator, generate_source

mx = pytest.importorskip("mlx.core")

from tests.kernels.test_metal import (  # noqa: E402
    POSITIONS,
    attention_case,
    quantized,
    row_mismatches,
    rows_pool,
    weights,
)


@pytest.fixture(scope="session")
def emulator_cache(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("metal-emulator") if cache else tmp_path_factory.mktemp("metal-emulator")


@pytest.fixture(scope="module")
def emulator(emulator_cache):
    return Emulator(emulator_cache)



# ---- the row-invariance harness -----------------------------------------------------------

def test_harness_catches_a_row_count_dependent_shader(emulator):
    """Negative control through the emulator: a dot product whose K split follows M."""
    body = """
    const int M = x_shape[0];
    const int K = x_shape[1];
    const int row = int(thread_position_in_grid.x);
    if (row < M) {
      const int split = M > 4 ? 2 : 1;
      float part[2] = {0.0f, 0.0f};
      for (int k = 0; k < K; ++k) {
        part[k % split] = metal::fma(x[row * K + k], w[k], part[k % split]);
      }
      out[row] = part[0] + part[1];
    }"""
    spec = ShaderSpec("split_follows_rows", ("x", "w"), ("out",), body)
    rng = np.random.default_rng(4)
    w = rng.standard_normal(300).astype(np.float32)

    def compute(xs):
        return emulator.run(spec, [xs, w], [], (32, 1, 1), (32, 1, 1), [(len(xs),)],
                            ["float32"])[0][:, None]
    assert row_mismatches(compute, rows_pool(rng, 16, 300)) != []


# ---- emulator: thread order, subset, built-ins ---------------------------------------------

def test_emulator_results_do_not_depend_on_thread_order(emulator_cache):
    """Races on threadgroup memory would show as different bits when fibers run reversed."""
    rng = np.random.default_rng(17)
    forward = MetalShaders("emulator", cache_dir=emulator_cache)
    backward = MetalShaders("emulator", cache_dir=emulator_cache, reverse_thread_order=True)
    x, w = rows_pool(rng, 5, 200), weights(rng, 12, 200, "bfloat16")
    wq, scales, biases = quantized(rng, 12, 256, 64, 4)
    q, keys, values = attention_case(rng, "float32")
    calls = [lambda s: s.matmul(x, w), lambda s: s.rms_norm(x, x[0], 1e-6),
             lambda s: s.softmax(x), lambda s: s.quantized_matmul(x[:, :128].repeat(2, 1), wq,
                                                                 scales, biases, 64, 4),
             lambda s: s.attention(q, keys, values, POSITIONS, 0, 0.125)]
    for call in calls:
        assert np.array_equal(call(forward).view(np.uint32), call(backward).view(np.uint32))


def test_reversed_thread_order_exposes_a_missing_barrier(emulator_cache):
    """Control for the test above: a body that reads a neighbour's threadgroup slot without a
    barrier gives different bits when the fibers run in reverse."""
    body = """
    threadgroup float slots[64];
    const uint t = thread_index_in_threadgroup;
    slots[t] = x[t];
    out[t] = slots[(t + 1) % 64];"""
    spec = ShaderSpec("missing_barrier", ("x",), ("out",), body)
    x = np.arange(1, 65, dtype=np.float32)
    results = [Emulator(emulator_cache, reverse_thread_order=reverse).run(
        spec, [x], [], (64, 1, 1), (64, 1, 1), [(64,)], ["float32"])[0] for reverse in (0, 1)]
    assert not np.array_equal(results[0], results[1])


def test_emulator_header_helpers(emulator):
    header = """
    inline float butterfly_sum(float v) {
      for (ushort offset = 16; offset > 0; offset /= 2) v = v + metal::simd_shuffle_xor(v, offset);
      return v;
    }
    """
    body = "const uint i = thread_position_in_grid.x;\nout[i] = butterfly_sum(x[i]);"
    spec = ShaderSpec("header_helper", ("x",), ("out",), body, header)
    x = (np.random.default_rng(23).standard_normal(32) * 1e4).astype(np.float32)
    out = emulator.run(spec, [x], [], (32, 1, 1), (32, 1, 1), [(32,)], ["float32"])[0]
    expected = x.copy()
    for offset in (16, 8, 4, 2, 1):
        expected = expected + expected[np.arange(32) ^ offset]
    assert np.array_equal(out, expected)


def test_generated_signature_is_mlx_text():
    spec = ShaderSpec("demo", ("a", "eps", "b"), ("out",),
                      "out[thread_position_in_grid.x] = a[0] + b_shape[0] * eps;")
    name, text, _ = generate_source(spec, [("bfloat16", (4, 9)), ("float32", ()),
                                           ("int32", (3,))], ["float32"], [("T", "float16"),
                                                                           ("N", 8)])
    assert name == "custom_kernel_demo__float16_t_8_bfloat16_t_floats_int32_tc_float"
    assert text == (
        "template <typename T, int N>\n"
        f"[[kernel]] void {name}(\n"
        "  const device bfloat16_t* a [[buffer(0)]],\n"
        "  const constant float& eps [[buffer(1)]],\n"
        "  const constant int32_t* b [[buffer(2)]],\n"
        "  const constant int* b_shape [[buffer(3)]],\n"
        "  device float* out [[buffer(4)]],\n"
        "  uint3 thread_position_in_grid [[thread_position_in_grid]]) {\n"
        f"{spec.body}\n}}\n\n"
        f'template [[host_name("{name}")]] [[kernel]] decltype({name}<float16_t, 8>) '
        f"{name}<float16_t, 8>;\n")


OUTSIDE_SUBSET = {
    "fast math": "out[i] = metal::fast::exp(x[i]);",
    "precise namespace": "out[i] = metal::precise::exp(x[i]);",
    "unqualified math": "out[i] = exp(x[i]);",
    "vector type": "float4 v = float4(x[i]); out[i] = v.x;",
    "native half": "half h = half(x[i]); out[i] = float(h);",
    "atomics": "metal::atomic_fetch_add_explicit(out, x[i], metal::memory_order_relaxed);",
    "simdgroup matrix": "metal::simdgroup_float8x8 m; out[i] = x[i];",
    "threadgroup pointer": "threadgroup float b[64]; threadgroup float* p = b; out[i] = p[0];",
    "quadgroup attribute": "out[i] = float(thread_index_in_quadgroup);",
    "implicit half": "float16_t h = float16_t(x[i]); out[i] = h * 2.0f;",
}


@pytest.mark.parametrize("construct", sorted(OUTSIDE_SUBSET))
def test_emulator_refuses_constructs_outside_the_subset(emulator, construct):
    body = "const uint i = thread_position_in_grid.x;\n" + OUTSIDE_SUBSET[construct]
    spec = ShaderSpec("outside_" + construct.replace(" ", "_"), ("x",), ("out",), body)
    x = np.zeros(64, np.float32)
    with pytest.raises(MetalShaderError, match="failed|outside the subset"):
        emulator.run(spec, [x], [], (64, 1, 1), (64, 1, 1), [(64,)], ["float32"])


def test_emulator_simd_builtins(emulator):
    body = """
    const uint i = thread_position_in_grid.x;
    const uint lane = thread_index_in_simdgroup;
    const float v = x[i];
    out[i * 6 + 0] = metal::simd_sum(v);
    out[i * 6 + 1] = metal::simd_max(v);
    out[i * 6 + 2] = metal::simd_shuffle(v, ushort(31 - lane));
    out[i * 6 + 3] = metal::simd_shuffle_xor(v, ushort(5));
    out[i * 6 + 4] = metal::simd_shuffle_down(v, ushort(3));
    out[i * 6 + 5] = metal::simd_shuffle_up(v, ushort(2));"""
    spec = ShaderSpec("simd_builtins", ("x",), ("out",), body)
    x = (np.random.default_rng(18).standard_normal(64) * 1e3).astype(np.float32)
    out = emulator.run(spec, [x], [], (64, 1, 1), (64, 1, 1), [(64 * 6,)], ["float32"])[0]
    out = out.reshape(2, 32, 6)
    lanes = np.arange(32)
    for group, values in enumerate(x.reshape(2, 32)):
        tree = values.copy()
        for offset in (16, 8, 4, 2, 1):
            tree[:offset] = tree[:offset] + tree[offset:2 * offset]
        assert np.array_equal(out[group, :, 0], np.full(32, tree[0], np.float32))
        assert np.array_equal(out[group, :, 1], np.full(32, values.max()))
        assert np.array_equal(out[group, :, 2], values[31 - lanes])
        assert np.array_equal(out[group, :, 3], values[lanes ^ 5])
        assert np.array_equal(out[group, :, 4], np.where(lanes + 3 < 32, values[(lanes + 3) % 32],
                                                         values))
        assert np.array_equal(out[group, :, 5], np.where(lanes >= 2, values[lanes - 2], values))


@pytest.mark.parametrize("body", [
    "if (thread_index_in_threadgroup < 32) { metal::threadgroup_barrier("
    "metal::mem_flags::mem_threadgroup); }\nout[thread_position_in_grid.x] = x[0];",
    "float v = x[thread_position_in_grid.x];\nif (thread_index_in_simdgroup < 16) { "
    "v = metal::simd_sum(v); }\nout[thread_position_in_grid.x] = v;",
], ids=["barrier", "simd"])
def test_emulator_reports_divergent_synchronisation(emulator, body):
    spec = ShaderSpec("divergent_" + str(len(body)), ("x",), ("out",), body)
    with pytest.raises(MetalShaderError, match="every thread"):
        emulator.run(spec, [np.zeros(64, np.float32)], [], (64, 1, 1), (64, 1, 1), [(64,)],
                     ["float32"])


def test_emulator_half_and_bfloat_conversions(emulator):
    body = """
    const uint i = thread_position_in_grid.x;
    halves[i] = float16_t(x[i]);
    bfloats[i] = bfloat16_t(x[i]);
    from_half[i] = float(h[i]);
    from_bfloat[i] = float(b[i]);"""
    spec = ShaderSpec("conversions", ("x", "h", "b"), ("halves", "bfloats", "from_half",
                                                       "from_bfloat"), body)
    rng = np.random.default_rng(19)
    special = [0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 1e9, 2.0 ** -25, 2.0 ** -25 * 1.0001,
               2.0 ** -24 * 1.5, 6.1e-5, 3.0e-39, np.inf, -np.inf, np.nan, 1.00390625, 1.01171875]
    x = np.concatenate([special, rng.standard_normal(111) * 10.0 ** rng.uniform(-9, 6, 111)])
    x = x.astype(np.float32)
    with np.errstate(over="ignore"):
        h = x.astype(np.float16)
    b = mx.array(x).astype(mx.bfloat16)
    halves, bfloats, from_half, from_bfloat = emulator.run(
        spec, [x, h, b], [], (128, 1, 1), (64, 1, 1), [(128,)] * 4,
        ["float16", "bfloat16", "float32", "float32"])
    finite = ~np.isnan(x)
    assert np.array_equal(halves.view(np.uint16)[finite], h.view(np.uint16)[finite])
    assert np.array_equal(bfloats[finite], np.asarray(b.view(mx.uint16))[finite])
    assert np.isnan(halves[~finite]).all() and np.isnan(from_half[~finite]).all()
    assert np.array_equal(from_half[finite].view(np.uint32), h[finite].astype(np.float32)
                          .view(np.uint32))
    assert np.array_equal(from_bfloat[finite].view(np.uint32),
                          np.asarray(b.astype(mx.float32))[finite].view(np.uint32))
