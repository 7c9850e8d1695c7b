"""DraftModel: guesses are the draft model's keyed samples; its cache follows the commits."""

from __future__ import annotations

import pytest

from exactdraft import DraftContext, DraftModel, KeyedSampler, SamplingParams


def context(params, n_prompt):
    return DraftContext(params=params, sampler=KeyedSampler(), n_prompt=n_prompt)


def serial_samples(target, prompt, params, count):
    """What the draft model itself would write, one step at a time."""
    state = target.new_state()
    logits = target.forward(state, prompt)
    sequence = list(prompt)
    for _ in range(count):
        token = KeyedSampler().sample(logits[-1], params, pos=len(sequence), history=sequence,
                                      n_prompt=len(prompt))
        sequence.append(token)
        logits = target.forward(state, [token])
    return sequence[len(prompt):]


def test_guesses_are_the_draft_models_own_samples(tiny_targets):
    model = tiny_targets["qwen3"]
    params = SamplingParams(temperature=0.9, top_k=30, seed=8)
    prompt = [4, 8, 15, 16, 23, 42]
    drafter = DraftModel(model, max_draft=5)
    drafter.begin(prompt, context(params, len(prompt)))
    assert drafter.propose(prompt, 5) == serial_samples(model, prompt, params, 5)


def test_cache_is_cut_back_to_what_was_committed(tiny_targets):
    model = tiny_targets["llama"]
    params = SamplingParams(temperature=0.7, seed=3)
    prompt = [1, 2, 3, 4, 5, 6, 7]
    drafter = DraftModel(model, max_draft=4)
    drafter.begin(prompt, context(params, len(prompt)))
    first = drafter.propose(prompt, 4)
    # Suppose the first two guesses were kept and the target then wrote another token.
    committed = prompt + first[:2] + [(first[2] + 1) % model.vocab_size]
    again = drafter.propose(committed, 3)
    fresh = DraftModel(model, max_draft=4)
    fresh.begin(prompt, context(params, len(prompt)))
    assert again == fresh.propose(committed, 3)
    # The cache kept the shared prefix rather than starting over.
    assert drafter._state.length == len(committed) + 2


def test_limit_and_context_bound_the_guesses(tiny_targets):
    model = tiny_targets["llama"]
    drafter = DraftModel(model, max_draft=4)
    drafter.begin([1, 2], context(SamplingParams(seed=1), 2))
    assert len(drafter.propose([1, 2], 2)) == 2
    assert drafter.propose([1, 2], 0) == []
    long = [1] * (model.max_context - 1)
    assert len(drafter.propose(long, 4)) == 1


def test_bad_max_draft_is_refused(tiny_targets):
    with pytest.raises(ValueError, match="max_draft"):
        DraftModel(tiny_targets["llama"], max_draft=0)
