"""The mlx backend on device cpu: per-op row invariance, model exactness, MLX checkpoints."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (Linux: pip install 'mlx[cpu]')")

import exactdraft as xd  # noqa: E402
from exactdraft.backends.mlx_backend import MLXBackend  # noqa: E402
from exactdraft.formats import QuantizedTensor, affine_from_blocks  # noqa: E402
from exactdraft.guard import check_row_invariance, probe_tokens  # noqa: E402
from exactdraft.pretrained import build_target, load_checkpoint  # noqa: E402
from tests.exactness import ExactnessCheck  # noqa: E402

ROW_COUNTS = list(range(1, 17)) + [31, 64, 100]


@pytest.fixture(scope="module")
def backend() -> MLXBackend:
    return MLXBackend(device="cpu")


def rows_invariant(op, inputs) -> None:
    alone = [np.array(op(inputs[i:i + 1]).astype(mx.float32)) for i in range(max(ROW_COUNTS))]
    for count in ROW_COUNTS:
        together = np.array(op(inputs[:count]).astype(mx.float32))
        for row in range(count):
            assert together[row].tobytes() == alone[row][0].tobytes(), (count, row)


def random(shape, scale=1.0, seed=0):
    return mx.array((np.random.default_rng(seed).standard_normal(shape) * scale)
                    .astype(np.float32))


@pytest.mark.parametrize("kind", ["dense", "q4_1", "q8_0"])
def test_linear_rows_are_invariant(backend, kind):
    dense = np.array(random((192, 256), 0.05, 1))
    if kind == "dense":
        weight = backend.matrix(dense)
    else:
        import gguf
        from gguf.quants import quantize

        kind_enum = getattr(gguf.GGMLQuantizationType, kind.upper())
        weight = backend.matrix(QuantizedTensor(kind, quantize(dense, kind_enum), dense.shape))
    rows_invariant(lambda x: backend.linear(x, weight), random((100, 256), 1.0, 2))


def test_norm_and_elementwise_rows_are_invariant(backend):
    weight = backend.vector(np.linspace(0.5, 1.5, 96, dtype=np.float32))
    rows_invariant(lambda x: backend.rms_norm(x, weight, 1e-6), random((100, 96), 3.0, 3))
    rows_invariant(backend.silu_mul, random((100, 2 * 48), 4.0, 4))


@pytest.mark.parametrize("window", [0, 7])
def test_attention_rows_are_invariant(backend, window):
    keys, values = random((2, 512, 16), 2.0, 5), random((2, 512, 16), 1.0, 6)
    queries = random((512, 4, 16), 2.0, 7)
    start = 250
    alone = [np.array(backend.attention(queries[p:p + 1], keys, values, np.array([p]), window,
                                        0.25)) for p in range(start, start + 17)]
    for count in (1, 2, 5, 17):
        together = np.array(backend.attention(queries[start:start + count], keys, values,
                                              np.arange(start, start + count), window, 0.25))
        for row in range(count):
            assert together[row].tobytes() == alone[row][0].tobytes()


def test_negative_control_numpy_matmul_is_not_row_invariant():
    """numpy's BLAS gives a row other bits inside a multi-row product on this machine, so the
    checks above can fail."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 576)).astype(np.float32)
    w = rng.standard_normal((576, 1536)).astype(np.float32)
    together = x @ w
    assert any((x[i:i + 1] @ w)[0].tobytes() != together[i].tobytes() for i in range(16))


def test_gguf_blocks_map_losslessly_onto_the_affine_layout():
    import gguf
    from gguf.quants import quantize

    dense = np.random.default_rng(1).standard_normal((8, 128)).astype(np.float32)
    for kind in ("q4_0", "q4_1", "q8_0"):
        blocks = QuantizedTensor(kind, quantize(dense, getattr(gguf.GGMLQuantizationType,
                                                               kind.upper())), dense.shape)
        affine = affine_from_blocks(blocks)
        # Equal values (a zero weight may come out as +0 in one layout and -0 in the other).
        assert np.array_equal(affine.dequantize(), blocks.dequantize())
        theirs = mx.dequantize(mx.array(affine.packed), mx.array(affine.scales),
                               mx.array(affine.biases), group_size=32, bits=affine.bits)
        assert np.array_equal(np.array(theirs), blocks.dequantize())


@pytest.fixture(scope="module")
def mlx_targets(tiny_checkpoints):
    return {variant: build_target(load_checkpoint(folder), "mlx", device="cpu")
            for variant, folder in tiny_checkpoints.items()}


@pytest.mark.parametrize("variant", ["llama", "mistral", "qwen2-window", "qwen3"])
def test_model_agrees_with_torch_backend_and_is_exact(variant, mlx_targets, tiny_targets):
    target = mlx_targets[variant]
    tokens = probe_tokens(120, target.vocab_size, salt=9)
    ours = target.forward(target.new_state(), tokens, rows="all")
    torch_rows = tiny_targets[variant].forward(tiny_targets[variant].new_state(), tokens, "all")
    assert np.abs(ours - torch_rows).max() <= 2e-5 * np.abs(torch_rows).max()
    assert np.array_equal(ours.argmax(-1), torch_rows.argmax(-1))
    assert check_row_invariance(target, 9) is None
    state = target.new_state()
    begin = 0
    for size in (5, 90, 25):  # chunked prefill equals the one-pass rows
        rows = target.forward(state, tokens[begin:begin + size], rows="all")
        assert rows.tobytes() == ours[begin:begin + size].tobytes()
        begin += size


def drafted_runs(target, draft, guard, temperature) -> ExactnessCheck:
    """Prompt lookup and a draft model against serial runs, logits row by logits row."""
    serial = xd.Generator(target)
    lookup = xd.Generator(target, xd.PromptLookup(max_draft=6, min_match=1), guard=guard)
    model = xd.Generator(target, xd.DraftModel(draft, max_draft=4), guard=guard)
    check = ExactnessCheck()
    for seed in range(6):
        params = xd.SamplingParams(temperature=temperature, top_k=40, top_p=0.9, seed=seed)
        prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 40 + seed]
        for generator in (lookup, model):
            check.compare(generator, prompt, 25, params, serial=serial, stop_tokens=[],
                          label=f"{generator.drafter!r} seed {seed}")
    return check


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.5])
def test_drafted_equals_serial_on_mlx(mlx_targets, temperature):
    drafted_runs(mlx_targets["llama"], mlx_targets["llama-tied"], True,
                 temperature).assert_exact()


def test_negative_control_drafted_runs(inexact_targets):
    """The same comparison fails on a backend whose multi-row passes are off by ulps."""
    drafted_runs(inexact_targets(), inexact_targets("llama-tied"), False, 0.7).assert_caught()


@pytest.mark.parametrize("bits,group_size", [(4, 32), (8, 64)])
def test_mlx_quantized_checkpoint_matches_mlx_lm(tmp_path, tiny_checkpoints, bits, group_size):
    mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm is not installed")
    out = str(tmp_path / "quantized")
    mlx_lm.convert(tiny_checkpoints["qwen3"], out, quantize=True, q_group_size=group_size,
                   q_bits=bits)
    checkpoint = load_checkpoint(out)
    target = build_target(checkpoint, "mlx", device="cpu")
    tokens = probe_tokens(40, target.vocab_size, salt=2)
    ours = target.forward(target.new_state(), tokens, rows="all")
    model, _ = mlx_lm.load(out)
    theirs = np.array(model(mx.array([tokens]))[0].astype(mx.float32))
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
    # The torch backend reads the same checkpoint by dequantizing it.
    dequantized = build_target(checkpoint, "torch")
    assert np.abs(dequantized.forward(dequantized.new_state(), tokens, rows="all") - ours).max() \
        <= 1e-5 * np.abs(theirs).max()
    assert check_row_invariance(target, 5) is None
