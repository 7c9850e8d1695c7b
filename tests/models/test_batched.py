"""Many sequences in one pass: every sequence's logits (and cache) have the bits they get when
it runs alone, whatever else shares the pass, on every backend and family; with a negative
control on a backend whose matmul rows change with the row count."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.guard import probe_tokens
from tests.conftest import BACKENDS, VARIANTS


def passes(salt: int) -> list[list[int]]:
    """A prompt then single steps and verify windows of varied widths for one sequence."""
    vocab = 128
    widths = [37 + 11 * salt, 1, 4, 1, 7, 2]
    return [probe_tokens(w, vocab, salt=100 * salt + i) for i, w in enumerate(widths)]


def alone(target, sequence: list[list[int]]) -> list[bytes]:
    state = target.new_state()
    return [target.forward(state, tokens, rows="all").tobytes() for tokens in sequence]


def together(target, sequences: list[list[list[int]]]) -> list[list[bytes]]:
    """The sequences' passes batched, pass i of every sequence in one forward_batch, with a
    sequence joining late and one leaving early."""
    states = [target.new_state() for _ in sequences]
    out: list[list[bytes]] = [[] for _ in sequences]
    for step in range(max(len(s) for s in sequences) + 1):
        live = [i for i, s in enumerate(sequences)
                if (i != 2 or step >= 1) and 0 <= step - (i == 2) < len(s)]
        if not live:
            continue
        rows = target.forward_batch([states[i] for i in live],
                                    [sequences[i][step - (i == 2)] for i in live], rows="all")
        for i, logits in zip(live, rows):
            out[i].append(logits.tobytes())
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_batched_rows_equal_each_sequence_alone(variant, backend, targets_by_backend):
    target = targets_by_backend(backend, variant)
    sequences = [passes(salt) for salt in range(3)]
    sequences[1] = sequences[1][:3]  # leaves early
    assert together(target, sequences) == [alone(target, s) for s in sequences]


def test_last_rows_of_a_batch_are_each_sequences_last_row(tiny_targets):
    target = tiny_targets["qwen3"]
    prompts = [probe_tokens(n, 128, salt=n) for n in (5, 30, 1)]
    batched = target.forward_batch([target.new_state() for _ in prompts], prompts)
    for prompt, logits in zip(prompts, batched):
        assert logits.shape == (1, 128)
        assert logits.tobytes() == target.forward(target.new_state(), prompt).tobytes()


def test_the_batched_check_fails_on_a_row_count_dependent_backend(tiny_checkpoints):
    """Negative control: with torch's plain matmul (bits change with the row count) batched
    rows differ from rows alone, so the comparison above can fail."""
    from exactdraft.pretrained import build_target, load_checkpoint
    from tests.inexact import InexactTorchBackend

    target = build_target(load_checkpoint(tiny_checkpoints["llama"]), InexactTorchBackend())
    sequences = [passes(salt) for salt in range(3)]
    assert together(target, sequences) != [alone(target, s) for s in sequences]


def test_forward_batch_refuses_bad_calls(tiny_targets):
    from exactdraft.errors import ParameterError

    target = tiny_targets["llama"]
    state = target.new_state()
    with pytest.raises(ParameterError, match="one token list per state"):
        target.forward_batch([state], [[1], [2]])
    with pytest.raises(ParameterError, match="appears twice"):
        target.forward_batch([state, state], [[1], [2]])
    assert state.length == 0
    target.forward_batch([state, target.new_state()], [[1, 2], [3]])
    assert np.array(state.length) == 2
