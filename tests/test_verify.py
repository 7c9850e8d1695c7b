"""ExactVerifier: keep while equal, replace the first mismatch, bonus after the last draft."""

from __future__ import annotations

from exactdraft import ExactVerifier, KeyedSampler, SamplingParams


def serial_continuation(target, prompt, params, count):
    state = target.new_state()
    logits = target.forward(state, prompt)
    sequence = list(prompt)
    for _ in range(count):
        sequence.append(KeyedSampler().sample(logits[-1], params, pos=len(sequence),
                                              history=sequence, n_prompt=len(prompt)))
        logits = target.forward(state, [sequence[-1]])
    return sequence[len(prompt):]


def run_verify(target, prompt, params, first, drafts):
    state = target.new_state()
    target.forward(state, prompt)
    history = list(prompt) + [first]
    verdict = ExactVerifier().verify(target, state, drafts, sampler=KeyedSampler(),
                                     params=params, history=history, n_prompt=len(prompt))
    return verdict, state


def test_all_kept_gives_the_bonus_token(tiny_targets):
    target = tiny_targets["llama"]
    params = SamplingParams(temperature=1.0, seed=21)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    serial = serial_continuation(target, prompt, params, 6)
    verdict, state = run_verify(target, prompt, params, serial[0], serial[1:5])
    assert (verdict.accepted, verdict.token) == (4, serial[5])
    assert state.length == len(prompt) + 5  # first token and the four kept drafts


def test_first_mismatch_is_replaced_and_state_rolled_back(tiny_targets):
    target = tiny_targets["llama"]
    params = SamplingParams(temperature=0.6, top_p=0.9, seed=5)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    serial = serial_continuation(target, prompt, params, 6)
    for wrong_at in range(4):
        drafts = list(serial[1:5])
        drafts[wrong_at] = (drafts[wrong_at] + 1) % target.vocab_size
        verdict, state = run_verify(target, prompt, params, serial[0], drafts)
        assert (verdict.accepted, verdict.token) == (wrong_at, serial[1 + wrong_at])
        assert state.length == len(prompt) + 1 + wrong_at


def test_no_drafts_is_a_serial_step(tiny_targets):
    target = tiny_targets["mistral"]
    params = SamplingParams(temperature=0.0)
    prompt = [7, 7, 8, 9]
    serial = serial_continuation(target, prompt, params, 2)
    verdict, state = run_verify(target, prompt, params, serial[0], [])
    assert (verdict.accepted, verdict.token) == (0, serial[1])
    assert state.length == len(prompt) + 1
