"""forward(..., features=True): each appended row's final hidden state (the lm_head input) has
the bits of a one-row step at that position, however many rows share the pass, and asking for
features changes no bit of the logits; with a negative control on a backend whose multi-row
passes are off by ulps."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.guard import probe_tokens

VARIANTS = ["llama", "llama-tied", "qwen2-window", "qwen3", "gemma3"]
PROMPT = probe_tokens(29, 128, salt=3)
WINDOW = probe_tokens(7, 128, salt=4)


def stepped(target, tokens: list[int]) -> list[bytes]:
    """Each row's features from one-row passes after PROMPT."""
    state = target.new_state()
    target.forward(state, PROMPT, features=True)
    return [target.forward(state, [token], features=True)[1].tobytes() for token in tokens]


def windowed(target, tokens: list[int]) -> list[bytes]:
    state = target.new_state()
    target.forward(state, PROMPT, features=True)
    _, features = target.forward(state, tokens, rows="all", features=True)
    return [row.tobytes() for row in features[:, None]]


@pytest.mark.parametrize("variant", VARIANTS)
def test_window_rows_have_the_bits_of_single_steps(tiny_targets, variant):
    target = tiny_targets[variant]
    assert windowed(target, WINDOW) == stepped(target, WINDOW)


@pytest.mark.parametrize("variant", ["llama", "gemma3"])
def test_prompt_features_do_not_depend_on_chunks(tiny_targets, variant):
    target = tiny_targets[variant]
    whole = target.forward(target.new_state(), PROMPT, features=True)[1]
    state, parts = target.new_state(), []
    for begin in (0, 5, 6, 19):
        end = {0: 5, 5: 6, 6: 19, 19: len(PROMPT)}[begin]
        parts.append(target.forward(state, PROMPT[begin:end], features=True)[1])
    assert whole.dtype == np.float32 and whole.shape == (len(PROMPT), target.config.hidden_size)
    assert np.concatenate(parts).tobytes() == whole.tobytes()


@pytest.mark.parametrize("rows", ["last", "all"])
def test_features_change_no_logit_bit(tiny_targets, rows):
    target = tiny_targets["llama"]
    plain = target.forward(target.new_state(), PROMPT, rows=rows)
    logits, features = target.forward(target.new_state(), PROMPT, rows=rows, features=True)
    assert logits.tobytes() == plain.tobytes()
    assert features.shape[0] == len(PROMPT)


def test_features_are_the_lm_head_input(tiny_targets):
    target = tiny_targets["llama"]
    logits, features = target.forward(target.new_state(), PROMPT, rows="all", features=True)
    expected = features @ target.output_rows(np.arange(target.vocab_size)).T
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4)


def own_features(target) -> None:
    """Two sequences in one pass get the features each gets alone."""
    other = probe_tokens(11, 128, salt=9)
    states = [target.new_state(), target.new_state()]
    _, features = target.forward_batch(states, [PROMPT, other], rows="last", features=True)
    for tokens, got in zip((PROMPT, other), features):
        alone = target.forward(target.new_state(), tokens, features=True)[1]
        assert got.tobytes() == alone.tobytes()


def test_batched_sequences_get_their_own_features(tiny_targets):
    own_features(tiny_targets["qwen3"])


def test_tree_rows_have_the_bits_of_their_paths(tiny_targets):
    target = tiny_targets["llama"]
    assert target.supports_trees
    state = target.new_state()
    target.forward(state, PROMPT)
    tokens, parents = [5, 6, 7, 8], [-1, 0, 0, 2]
    _, features = target.forward_tree(state, tokens, parents, features=True)
    for node, path in ((1, [5, 6]), (3, [5, 7, 8])):
        serial = target.new_state()
        target.forward(serial, PROMPT)
        row = target.forward(serial, path, rows="all", features=True)[1][-1]
        assert features[node].tobytes() == row.tobytes()


def test_negative_control_inexact_backend_differs(inexact_targets):
    """On InexactTorchBackend a window's features differ from single steps: the byte
    comparison above can fail."""
    target = inexact_targets("llama")
    window, steps = windowed(target, WINDOW), stepped(target, WINDOW)
    assert sum(a != b for a, b in zip(window, steps)) >= 1


# -- the hybrid and mixture-of-experts families ---------------------------------------------

HYBRID_VARIANTS = ["qwen3_moe", "mixtral", "qwen3_next", "qwen3_5", "nemotron_h"]


@pytest.mark.parametrize("variant", HYBRID_VARIANTS)
def test_hybrid_window_rows_have_the_bits_of_single_steps(hybrid_targets, variant):
    target = hybrid_targets(variant)
    assert target.returns_features
    assert windowed(target, WINDOW) == stepped(target, WINDOW)


@pytest.mark.parametrize("variant", ["qwen3_next", "nemotron_h"])
@pytest.mark.parametrize("rows", ["last", "all"])
def test_hybrid_features_change_no_logit_bit(hybrid_targets, variant, rows):
    target = hybrid_targets(variant)
    plain = target.forward(target.new_state(), PROMPT, rows=rows)
    logits, features = target.forward(target.new_state(), PROMPT, rows=rows, features=True)
    assert logits.tobytes() == plain.tobytes()
    assert features.shape == (len(PROMPT), target.head_shape.hidden_size)
    expected = features @ target.output_rows(np.arange(target.vocab_size)).T
    np.testing.assert_allclose(logits, expected[-logits.shape[0]:], rtol=1e-4, atol=1e-4)


def test_hybrid_batched_sequences_get_their_own_features(hybrid_targets):
    own_features(hybrid_targets("qwen3_next"))


def test_negative_control_inexact_hybrid_differs(hybrid_checkpoints):
    import torch

    from exactdraft.pretrained import build_target, load_checkpoint
    from tests.inexact import InexactTorchBackend

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = build_target(load_checkpoint(hybrid_checkpoints["qwen3_next"]),
                              InexactTorchBackend())
        window, steps = windowed(target, WINDOW), stepped(target, WINDOW)
    finally:
        torch.set_num_threads(threads)
    assert sum(a != b for a, b in zip(window, steps)) >= 1
