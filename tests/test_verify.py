"""ExactVerifier: keep while equal, replace the first mismatch, bonus after the last draft; trees
walk the same way; the per-row transform applies to every row drawn from, as in a serial step."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft import ExactVerifier, KeyedSampler, SamplingParams
from exactdraft.verify import tree_rows


def serial_continuation(target, prompt, params, count, transform=None):
    state = target.new_state()
    logits = target.forward(state, prompt)
    sequence = list(prompt)
    for _ in range(count):
        row = logits[-1] if transform is None else transform(logits[-1], sequence)
        sequence.append(KeyedSampler().sample(row, params, pos=len(sequence),
                                              history=sequence, n_prompt=len(prompt)))
        logits = target.forward(state, [sequence[-1]])
    return sequence[len(prompt):]


def run_verify(target, prompt, params, first, drafts, parents=None, transform=None):
    """One verify pass over [first, *drafts] after the prompt, judged by ExactVerifier."""
    state = target.new_state()
    target.forward(state, prompt)
    history = list(prompt) + [first]
    tokens, row_parents = tree_rows(first, drafts, parents)
    if parents is None:
        rows = target.forward(state, tokens, rows="all")
    else:
        rows = target.forward_tree(state, tokens, row_parents)
    return ExactVerifier().verify(rows, drafts, parents=parents, sampler=KeyedSampler(),
                                  params=params, history=history, n_prompt=len(prompt),
                                  transform=transform)


def test_all_kept_gives_the_bonus_token(tiny_targets):
    target = tiny_targets["llama"]
    params = SamplingParams(temperature=1.0, seed=21)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    serial = serial_continuation(target, prompt, params, 6)
    verdict = run_verify(target, prompt, params, serial[0], serial[1:5])
    assert (verdict.accepted, verdict.token) == (4, serial[5])
    assert verdict.path == [0, 1, 2, 3, 4]
    assert verdict.tokens == serial[1:6]


def test_first_mismatch_is_replaced(tiny_targets):
    target = tiny_targets["llama"]
    params = SamplingParams(temperature=0.6, top_p=0.9, seed=5)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    serial = serial_continuation(target, prompt, params, 6)
    for wrong_at in range(4):
        drafts = list(serial[1:5])
        drafts[wrong_at] = (drafts[wrong_at] + 1) % target.vocab_size
        verdict = run_verify(target, prompt, params, serial[0], drafts)
        assert (verdict.accepted, verdict.token) == (wrong_at, serial[1 + wrong_at])
        assert verdict.path == list(range(wrong_at + 1))


def test_no_drafts_is_a_serial_step(tiny_targets):
    target = tiny_targets["mistral"]
    params = SamplingParams(temperature=0.0)
    prompt = [7, 7, 8, 9]
    serial = serial_continuation(target, prompt, params, 2)
    verdict = run_verify(target, prompt, params, serial[0], [])
    assert (verdict.accepted, verdict.token, verdict.path) == (0, serial[1], [0])


def test_a_tree_keeps_the_path_of_samples_never_a_child_of_a_rejected_node(tiny_targets):
    target = tiny_targets["llama"]
    params = SamplingParams(temperature=0.8, seed=3)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    serial = serial_continuation(target, prompt, params, 5)
    wrong = (serial[1] + 1) % target.vocab_size
    # Draft 0 is wrong; its child (draft 2) holds the true second token, which must not be
    # taken: the walk leaves draft 0. Draft 1 is right, with the true next token under it.
    drafts = [wrong, serial[1], serial[2], serial[2]]
    parents = [-1, -1, 0, 1]
    verdict = run_verify(target, prompt, params, serial[0], drafts, parents)
    assert verdict.kept == serial[1:3]
    assert verdict.path == [0, 2, 4]
    assert verdict.token == serial[3]


def test_the_transform_applies_to_every_row_with_its_own_history(tiny_targets):
    target = tiny_targets["llama"]
    params = SamplingParams(temperature=0.9, seed=11)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    banned_after = {}

    def ban_even_ids_after_odd_tokens(row, history):
        banned_after[len(history)] = list(history)
        row = np.array(row, dtype=np.float32, copy=True)
        if history[-1] % 2:
            row[::2] = -np.inf
        return row

    serial = serial_continuation(target, prompt, params, 6, ban_even_ids_after_odd_tokens)
    plain = serial_continuation(target, prompt, params, 6)
    assert serial != plain  # the transform changes what is drawn: the check below has power
    banned_after.clear()
    verdict = run_verify(target, prompt, params, serial[0], serial[1:5],
                         transform=ban_even_ids_after_odd_tokens)
    assert verdict.tokens == serial[1:6]
    history = list(prompt) + serial[:1]
    for offset in range(5):  # each row saw exactly its own prefix
        assert banned_after[len(history) + offset] == history + serial[1:1 + offset]
    assert all(not np.isfinite(row[::2]).any()
               for row, token in zip(verdict.rows, [serial[0], *serial[1:5]]) if token % 2)
    # Untransformed, the same drafts are judged against other samples.
    untransformed = run_verify(target, prompt, params, serial[0], serial[1:5])
    assert untransformed.tokens != verdict.tokens


def test_rows_short_of_the_drafts_are_refused(tiny_targets):
    target = tiny_targets["llama"]
    rows = target.forward(target.new_state(), [1, 2, 3], rows="all")
    with pytest.raises(ValueError, match="needs as many rows"):
        ExactVerifier().verify(rows[:2], [5, 6], sampler=KeyedSampler(),
                               params=SamplingParams(temperature=0.0), history=[1, 2],
                               n_prompt=2)
