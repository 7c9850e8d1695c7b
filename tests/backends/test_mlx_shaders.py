"""The mlx backend's shader path (what device "gpu" runs on a Mac) end to end through the shader
emulator: tiny llama and qwen3 checkpoints and an MLX affine-quantized one agree with reference
implementations, a W-row verify equals W single steps bit for bit, chunked prefill equals
one-pass prefill bit for bit, and drafted output equals serial output. The negative control is
a matmul shader whose lane-sum order follows the row count: the same checks catch it."""

from __future__ import annotations

import importlib.util
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (Linux: pip install 'mlx[cpu]')")
if shutil.which("c++") is None:
    pytest.skip("the shader emulator needs a C++ compiler (c++)", allow_module_level=True)

import exactdraft as xd  # noqa: E402
from exactdraft.backends.mlx_backend import (  # noqa: E402
    CHECKED_MLX_VERSIONS,
    MLXBackend,
    QuantizedLinear,
)
from exactdraft.errors import BackendError  # noqa: E402
from exactdraft.formats import AffineQuantizedTensor  # noqa: E402
from exactdraft.guard import check_row_invariance, probe_tokens  # noqa: E402
from exactdraft.kernels.metal import SOURCE_DIR, MetalShaders, metal_available  # noqa: E402
from exactdraft.pretrained import build_target, load_checkpoint  # noqa: E402
from tests.exactness import ExactnessCheck  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ["llama", "qwen3"]
# 80 positions cross the attention shader's 64-key chunk boundary.
TOKENS = probe_tokens(80, 128, salt=9)
CHUNKS = (5, 60, 15)


@pytest.fixture(scope="module")
def emulator_cache(request, tmp_path_factory):
    cache = getattr(request.config, "cache", None)
    return cache.mkdir("metal-emulator") if cache else tmp_path_factory.mktemp("metal-emulator")


@pytest.fixture(scope="module")
def shaders(emulator_cache) -> MetalShaders:
    return MetalShaders("emulator", cache_dir=emulator_cache)


@pytest.fixture(scope="module")
def shader_targets(tiny_checkpoints, shaders):
    return {variant: build_target(load_checkpoint(tiny_checkpoints[variant]),
                                  MLXBackend(shaders=shaders))
            for variant in VARIANTS}


@pytest.fixture(scope="module")
def mlx_draft_target(tiny_checkpoints, tmp_path_factory):
    """A draft model close to the tiny llama (perturbed weights) on MLX's CPU ops. (A torch
    draft works too, but its tiny matmuls were measured at ~14 ms each when interleaved with MLX
    work in one process, which made this test several times slower.)"""
    from tests.conftest import perturbed_copy

    folder = perturbed_copy(tiny_checkpoints["llama"], str(tmp_path_factory.mktemp("draft")),
                            scale=0.08)
    return build_target(load_checkpoint(folder), MLXBackend())


def chunked_rows(target, tokens, chunks) -> np.ndarray:
    state, begin, rows = target.new_state(), 0, []
    for size in chunks:
        rows.append(target.forward(state, tokens[begin:begin + size], rows="all"))
        begin += size
    return np.concatenate(rows)


# ---- tiny dense checkpoints ---------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_agree_with_torch_and_chunked_prefill_is_exact(variant, shader_targets,
                                                              tiny_targets):
    target = shader_targets[variant]
    ours = target.forward(target.new_state(), TOKENS, rows="all")
    reference = tiny_targets[variant]
    theirs = reference.forward(reference.new_state(), TOKENS, rows="all")
    assert np.abs(ours - theirs).max() <= 2e-5 * np.abs(theirs).max()
    assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))
    assert chunked_rows(target, TOKENS, CHUNKS).tobytes() == ours.tobytes()


@pytest.mark.parametrize("variant", VARIANTS)
def test_verify_rows_equal_single_steps(variant, shader_targets):
    target = shader_targets[variant]
    assert target.backend.key_block == 64  # the guard's probe crosses a shader chunk boundary
    assert check_row_invariance(target, 5) is None


def test_bfloat16_compute_is_exact(tiny_checkpoints, shaders, shader_targets):
    """bfloat16 activations, weights and KV cache: the shaders take float32 activations and
    bfloat16 weights and caches, and the model stays row invariant."""
    target = build_target(load_checkpoint(tiny_checkpoints["llama"]),
                          MLXBackend(dtype="bfloat16", shaders=shaders))
    ours = target.forward(target.new_state(), TOKENS, rows="all")
    full = shader_targets["llama"].forward(shader_targets["llama"].new_state(), TOKENS, "all")
    assert np.abs(ours - full).max() <= 0.1 * np.abs(full).max()
    assert chunked_rows(target, TOKENS, CHUNKS).tobytes() == ours.tobytes()
    assert check_row_invariance(target, 5) is None


def drafted_runs(target, draft, guard, temperature) -> ExactnessCheck:
    serial = xd.Generator(target)
    lookup = xd.Generator(target, xd.PromptLookup(max_draft=4, min_match=1),
                          adaptive_depth=False, guard=guard)
    model = xd.Generator(target, xd.DraftModel(draft, max_draft=4), adaptive_depth=False,
                         guard=guard)
    check = ExactnessCheck()
    for seed in range(2):
        params = xd.SamplingParams(temperature=temperature, top_p=0.9, seed=seed)
        prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 40 + seed]
        for generator in (lookup, model):
            check.compare(generator, prompt, 12, params, serial=serial, stop_tokens=[],
                          label=f"{generator.drafter!r} seed {seed}")
    return check


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_drafted_equals_serial(shader_targets, mlx_draft_target, temperature):
    drafted_runs(shader_targets["llama"], mlx_draft_target, True, temperature).assert_exact()


def test_row_count_dependent_shader_is_caught(tmp_path, tiny_checkpoints, emulator_cache,
                                              mlx_draft_target):
    """Negative control: the same model on a matmul shader that adds its lane partials in
    reverse order whenever the pass has more than one row fails the guard, the chunked
    prefill comparison and the drafted == serial comparison."""
    sources = tmp_path / "metal"
    shutil.copytree(SOURCE_DIR, sources)
    body = (sources / "matmul.metal").read_text()
    in_order = ("  float total = partials[t * LANES];\n"
                "  for (int l = 1; l < LANES; ++l) total = total + partials[t * LANES + l];\n")
    follows_rows = ("  float total = 0.0f;\n"
                    "  for (int i = 0; i < LANES; ++i) {\n"
                    "    const int l = M > 1 ? LANES - 1 - i : i;\n"
                    "    total = total + partials[t * LANES + l];\n"
                    "  }\n")
    assert in_order in body
    (sources / "matmul.metal").write_text(body.replace(in_order, follows_rows))
    broken = MetalShaders("emulator", cache_dir=emulator_cache, source_dir=sources)
    target = build_target(load_checkpoint(tiny_checkpoints["llama"]), MLXBackend(shaders=broken))
    assert check_row_invariance(target, 5) is not None
    one_pass = target.forward(target.new_state(), TOKENS[:20], rows="all")
    assert chunked_rows(target, TOKENS[:20], (1,) * 20).tobytes() != one_pass.tobytes()
    # And the drafted == serial comparison above, run with the guard off, fails on it.
    drafted_runs(target, mlx_draft_target, False, 0.8).assert_caught()


# ---- MLX affine-quantized checkpoint ------------------------------------------------------

def test_mlx_quantized_checkpoint_through_the_shader(tmp_path, tiny_checkpoints, shaders):
    mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")
    out = str(tmp_path / "quantized")
    mlx_lm.convert(tiny_checkpoints["qwen3"], out, quantize=True, q_group_size=32, q_bits=4)
    target = build_target(load_checkpoint(out), MLXBackend(shaders=shaders))
    assert isinstance(target.layers[0].mixer.qkv, QuantizedLinear)
    tokens = probe_tokens(40, target.vocab_size, salt=2)
    ours = target.forward(target.new_state(), tokens, rows="all")
    model, _ = mlx_lm.load(out)
    theirs = np.array(model(mx.array([tokens]))[0].astype(mx.float32))
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
    assert check_row_invariance(target, 5) is None


def test_group_128_is_split_for_the_shader(shaders):
    """The shader takes groups of 32 or 64; a group-128 weight reaches it as two groups of 64
    that share the scale and bias, which keeps every weight value."""
    rng = np.random.default_rng(3)
    dense = mx.array(rng.standard_normal((24, 256)).astype(np.float32))
    packed, scales, biases = mx.quantize(dense, group_size=128, bits=4)
    weight = AffineQuantizedTensor(np.array(packed), np.array(scales), np.array(biases), 128, 4)
    backend = MLXBackend(shaders=shaders)
    prepared = backend.matrix(weight)
    assert prepared.group_size == 64
    split = AffineQuantizedTensor(np.array(prepared.packed), np.array(prepared.scales),
                                  np.array(prepared.biases), 64, 4)
    assert np.array_equal(split.dequantize(), weight.dequantize())
    x = mx.array(rng.standard_normal((5, 256)).astype(np.float32))
    ours = np.array(backend.linear(x, prepared))
    theirs = np.array(mx.quantized_matmul(x, packed, scales, biases, transpose=True,
                                          group_size=128, bits=4))
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()


# ---- options and the MLX version guard ----------------------------------------------------

def test_backend_options(shaders):
    assert MLXBackend().shaders is None and MLXBackend().key_block == 256
    assert MLXBackend(shaders=shaders, key_block=128).key_block == 128
    with pytest.raises(BackendError, match="'cuda'"):
        MLXBackend(shaders="cuda")
    with pytest.raises(BackendError, match="device 'gpu' only"):
        MLXBackend(device="cpu", shaders="metal")
    with pytest.raises(BackendError, match="key_block 100"):
        MLXBackend(shaders=shaders, key_block=100)


@pytest.fixture
def default_device():
    """Put back MLX's default device, which a backend on device "gpu" switches (on a Mac)."""
    device = mx.default_device()
    yield
    mx.set_default_device(device)


def test_unchecked_mlx_version_warns_on_gpu(monkeypatch, default_device):
    monkeypatch.setattr(mx, "__version__", "0.0.1")
    with pytest.warns(RuntimeWarning, match="MLX 0.0.1 .* guard will decide"):
        if metal_available():
            MLXBackend(device="gpu")
        else:  # the warning comes before the missing Metal device is reported
            with pytest.raises(BackendError, match="Metal device"):
                MLXBackend(device="gpu")


def test_checked_mlx_version_or_cpu_device_does_not_warn(monkeypatch, default_device):
    monkeypatch.setattr(mx, "__version__", CHECKED_MLX_VERSIONS[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            MLXBackend(device="gpu")
        except BackendError:
            assert not metal_available()
        monkeypatch.setattr(mx, "__version__", "0.0.1")
        MLXBackend(device="cpu")


# ---- benchmarks/metal_check.py ------------------------------------------------------------

def load_metal_check():
    spec = importlib.util.spec_from_file_location(
        "metal_check_benchmark", REPO_ROOT / "benchmarks" / "metal_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_metal_check_model_smoke(tiny_checkpoints, capsys):
    status = load_metal_check().main(["--engine", "emulator", "--check", "model", "--quick",
                                      "--model", tiny_checkpoints["llama"],
                                      "--max-new-tokens", "6"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "rows equal single steps" in printed and "same 6 tokens" in printed
    assert "mlx_lm comparison skipped" in printed


@pytest.mark.slow
def test_metal_check_model_and_mlx_lm_smoke(tiny_checkpoints, capsys):
    pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")
    folder = tiny_checkpoints["llama"]
    status = load_metal_check().main(["--engine", "emulator", "--check", "model", "--quick",
                                      "--model", folder, "--mlx-model", folder])
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "mlx_lm" in printed and "tok/s" in printed
