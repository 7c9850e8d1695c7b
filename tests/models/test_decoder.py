"""DecoderModel against Hugging Face's own implementation, and its row invariance."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from exactdraft.guard import probe_tokens
from tests.conftest import BACKENDS, VARIANTS, read_config


@functools.cache
def hf_logits(folder: str, tokens: tuple[int, ...]) -> np.ndarray:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([list(tokens)])).logits[0].numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_transformers(variant, backend, tiny_checkpoints, targets_by_backend):
    folder, target = tiny_checkpoints[variant], targets_by_backend(backend, variant)
    tokens = probe_tokens(90, target.vocab_size, salt=3)  # longer than every sliding window
    ours = target.forward(target.new_state(), tokens, rows="all")
    reference = hf_logits(folder, tuple(tokens))
    scale = np.abs(reference).max()
    assert scale > 1.0  # the fixture's weights give logits that spread over several units
    assert np.abs(ours - reference).max() <= 2e-5 * scale, variant


LINEAR_ROPE = {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}


@pytest.fixture(scope="module")
def linear_rope_checkpoints(tmp_path_factory):
    """The tiny llama with linear rope scaling (factor 4), and the same weights without it."""
    from tests.conftest import build_tiny_checkpoint

    return {scaled: build_tiny_checkpoint(
        str(tmp_path_factory.mktemp(f"linear-rope-{scaled}")), "llama",
        rope_parameters=LINEAR_ROPE if scaled else {"rope_type": "default",
                                                     "rope_theta": 10000.0})
        for scaled in (True, False)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_rope_scaling_matches_transformers(backend, linear_rope_checkpoints):
    from exactdraft.pretrained import build_target, load_checkpoint

    if backend == "mlx":
        pytest.importorskip("mlx.core", reason="mlx is not installed")
    folder = linear_rope_checkpoints[True]
    assert read_config(folder)["rope_parameters"]["rope_type"] == "linear"
    checkpoint = load_checkpoint(folder)
    assert checkpoint.config.rope_scaling is not None
    target = build_target(checkpoint, backend)
    tokens = probe_tokens(90, target.vocab_size, salt=3)
    ours = target.forward(target.new_state(), tokens, rows="all")
    reference = hf_logits(folder, tuple(tokens))
    scale = np.abs(reference).max()
    assert np.abs(ours - reference).max() <= 2e-5 * scale
    # Control: the scaling matters at this tolerance. Transformers' own model without it (same
    # weights) is far from the scaled reference, and so would be a loader that dropped it.
    unscaled = hf_logits(linear_rope_checkpoints[False], tuple(tokens))
    assert np.abs(unscaled - reference).max() > 100 * 2e-5 * scale


def test_sliding_window_is_read_from_config(tiny_checkpoints, tiny_targets):
    assert tiny_targets["mistral"].config.sliding_windows == (24, 24)
    assert tiny_targets["qwen2-window"].config.sliding_windows == (0, 16)
    assert read_config(tiny_checkpoints["qwen2"])["use_sliding_window"] is False
    assert tiny_targets["qwen2"].config.sliding_windows == (0, 0)


def single_steps(target, prefix: list[int], tokens: list[int]) -> list[np.ndarray]:
    state = target.new_state()
    target.forward(state, prefix)
    return [target.forward(state, [t], rows="last")[0] for t in tokens]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_verify_window_equals_single_steps(variant, backend, targets_by_backend):
    target = targets_by_backend(backend, variant)
    block = target.backend.key_block
    # The prefix ends just before a key block boundary, so windows straddle it.
    prefix = probe_tokens(block - 5, target.vocab_size, salt=1)
    window = probe_tokens(16, target.vocab_size, salt=2)
    singles = single_steps(target, prefix, window)
    state = target.new_state()
    target.forward(state, prefix)
    for width in range(1, 17):
        target.truncate(state, len(prefix))
        rows = target.forward(state, window[:width], rows="all")
        for row in range(width):
            assert rows[row].tobytes() == singles[row].tobytes(), (variant, width, row)


@pytest.mark.parametrize("variant", ["llama", "mistral", "qwen3"])
def test_rows_last_is_last_of_rows_all(variant, tiny_targets):
    target = tiny_targets[variant]
    tokens = probe_tokens(37, target.vocab_size, salt=4)
    every = target.forward(target.new_state(), tokens, rows="all")
    last = target.forward(target.new_state(), tokens, rows="last")
    assert last.shape == (1, target.vocab_size)
    assert last[0].tobytes() == every[-1].tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", ["llama", "mistral", "qwen2-window", "qwen3"])
@pytest.mark.parametrize("chunks", [[1] * 20, [7, 250, 43], [256, 44], [3, 5, 11, 281]])
def test_chunked_prefill_equals_one_pass(variant, chunks, backend, targets_by_backend):
    target = targets_by_backend(backend, variant)
    tokens = probe_tokens(sum(chunks), target.vocab_size, salt=5)
    whole_state = target.new_state()
    whole = target.forward(whole_state, tokens, rows="all")
    state = target.new_state()
    begin = 0
    for size in chunks:
        rows = target.forward(state, tokens[begin:begin + size], rows="all")
        for row in range(size):
            assert rows[row].tobytes() == whole[begin + row].tobytes(), (variant, begin + row)
        begin += size
    for layer in range(target.config.num_layers):
        for ours, theirs in ((state.cache.keys, whole_state.cache.keys),
                             (state.cache.values, whole_state.cache.values)):
            a = target.backend.to_host(ours[layer][:, :begin])
            b = target.backend.to_host(theirs[layer][:, :begin])
            assert a.tobytes() == b.tobytes(), (variant, layer)


def test_rollback_then_continue_equals_fresh_run(tiny_targets):
    target = tiny_targets["llama"]
    tokens = probe_tokens(40, target.vocab_size, salt=6)
    fresh = target.forward(target.new_state(), tokens, rows="all")
    state = target.new_state()
    target.forward(state, tokens[:30])
    target.forward(state, probe_tokens(7, target.vocab_size, salt=7), rows="all")  # rejected
    target.truncate(state, 30)
    again = target.forward(state, tokens[30:], rows="all")
    assert again.tobytes() == fresh[30:].tobytes()


def test_negative_control_unpadded_model_breaks_invariance(tiny_checkpoints):
    """The same check fails for a model on a backend that uses torch's plain ops, so the
    invariance tests above can fail."""
    from exactdraft.pretrained import build_target, load_checkpoint
    from tests.inexact import InexactTorchBackend

    target = build_target(load_checkpoint(tiny_checkpoints["llama"]), InexactTorchBackend())
    prefix = probe_tokens(20, target.vocab_size, salt=1)
    window = probe_tokens(8, target.vocab_size, salt=2)
    singles = single_steps(target, prefix, window)
    state = target.new_state()
    target.forward(state, prefix)
    rows = target.forward(state, window, rows="all")
    assert any(rows[i].tobytes() != singles[i].tobytes() for i in range(8))
