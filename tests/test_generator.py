"""Drafted generation equals serial generation, token for token, across the sampling space."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactdraft as xd
from tests.text_tokenizer import PieceTokenizer

TEMPERATURES = [0.0, 0.3, 0.7, 1.0, 1.5]
FILTERS = {
    "plain": {},
    "top_k": dict(top_k=5),
    "top_p": dict(top_p=0.8),
    "min_p": dict(min_p=0.1),
    "penalties": dict(repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2),
    "combined": dict(top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                     presence_penalty=0.2, frequency_penalty=0.1, logit_bias={7: 1.5, 9: -2.0}),
}
PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7],
    [40, 41, 42, 43, 44, 45, 40, 41, 42, 43, 44, 45, 40, 41],
    [3, 17, 99, 3, 17, 99, 3, 17],
    list(range(60, 90)) + list(range(60, 70)),
]
SEEDS = range(20)


class OracleDrafter:
    """Proposes a known continuation with some tokens deliberately wrong, so verification sees
    long accepted runs, mismatches at every depth, and bonus tokens."""

    def __init__(self, continuation: list[int], max_draft: int, error_rate: float, seed: int):
        self.continuation = continuation
        self.max_draft = max_draft
        self.error_rate = error_rate
        self.rng = np.random.default_rng(seed)
        self.n_prompt = 0

    def begin(self, prompt, context):
        self.n_prompt = len(prompt)

    def propose(self, sequence, limit):
        done = len(sequence) - self.n_prompt
        guess = list(self.continuation[done:done + limit])
        for i in range(len(guess)):
            if self.rng.random() < self.error_rate:
                guess[i] = int(self.rng.integers(0, 128))
        return guess

    def accepted(self, proposed, accepted):
        pass


@pytest.fixture(scope="module")
def generators(tiny_targets, draft_target):
    target = tiny_targets["llama"]
    built = {"serial": xd.Generator(target)}
    for depth in range(1, 9):
        # Fixed depth: these tests count kept and rejected drafts, which the adaptive policy
        # (tested in tests/test_depth.py) would tie to timings.
        built["lookup", depth] = xd.Generator(
            target, xd.PromptLookup(max_draft=depth, min_match=1), adaptive_depth=False)
        built["model", depth] = xd.Generator(
            target, xd.DraftModel(draft_target, max_draft=depth), adaptive_depth=False)
    return built


@pytest.mark.parametrize("filter_name", sorted(FILTERS))
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_drafted_equals_serial(generators, temperature, filter_name):
    drafted = accepted = 0
    for seed in SEEDS:
        params = xd.SamplingParams(temperature=temperature, seed=seed, **FILTERS[filter_name])
        prompt = PROMPTS[seed % len(PROMPTS)]
        serial = generators["serial"].generate(prompt, 24, params, stop_tokens=[])
        assert serial.stats.drafted == 0 and len(serial.tokens) == 24
        for kind in ("lookup", "model"):
            generator = generators[kind, 1 + seed % 8]
            assert generator.drafting_enabled
            result = generator.generate(prompt, 24, params, stop_tokens=[])
            assert result.tokens == serial.tokens, (kind, seed)
            assert result.seed == seed
            drafted += result.stats.drafted
            accepted += result.stats.accepted
    # Both branches of verification ran: drafts kept and drafts replaced.
    assert 0 < accepted < drafted


@pytest.mark.parametrize("variant", ["llama-tied", "llama3-rope", "mistral", "qwen2",
                                     "qwen2-window", "qwen3"])
def test_drafted_equals_serial_every_family(tiny_targets, variant):
    target = tiny_targets[variant]
    serial = xd.Generator(target)
    drafted = xd.Generator(target, xd.PromptLookup(max_draft=5, min_match=1))
    self_drafted = xd.Generator(target, xd.DraftModel(target, max_draft=3))
    for temperature in (0.0, 0.7, 1.5):
        for seed in range(4):
            params = xd.SamplingParams(temperature=temperature, top_p=0.95, seed=seed)
            prompt = PROMPTS[seed] * 2  # long enough to pass the sliding windows
            reference = serial.generate(prompt, 30, params, stop_tokens=[]).tokens
            assert drafted.generate(prompt, 30, params, stop_tokens=[]).tokens == reference
            assert self_drafted.generate(prompt, 30, params, stop_tokens=[]).tokens == reference


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(temperature=st.sampled_from(TEMPERATURES), top_k=st.sampled_from([0, 3, 40]),
       top_p=st.sampled_from([1.0, 0.95, 0.6]), min_p=st.sampled_from([0.0, 0.02, 0.3]),
       repetition=st.sampled_from([1.0, 1.15]), presence=st.sampled_from([0.0, 0.4]),
       frequency=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**64 - 1),
       depth=st.integers(1, 8), error_rate=st.sampled_from([0.0, 0.2, 0.6, 1.0]),
       prompt=st.lists(st.integers(0, 127), min_size=1, max_size=40),
       max_new=st.integers(1, 30))
def test_random_settings_with_oracle_drafts(tiny_targets, temperature, top_k, top_p, min_p,
                                            repetition, presence, frequency, seed, depth,
                                            error_rate, prompt, max_new):
    target = tiny_targets["llama"]
    params = xd.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                               repetition_penalty=repetition, presence_penalty=presence,
                               frequency_penalty=frequency, seed=seed)
    serial = xd.Generator(target).generate(prompt, max_new, params)
    oracle = OracleDrafter(serial.tokens, depth, error_rate, seed % 1000)
    drafted = xd.Generator(target, oracle, adaptive_depth=False).generate(prompt, max_new,
                                                                         params)
    assert drafted.tokens == serial.tokens
    assert drafted.finish_reason == serial.finish_reason
    stats = drafted.stats
    # Every pass commits its kept drafts and one token of the target's own.
    assert stats.target_passes <= len(drafted.tokens) - 1 <= stats.target_passes + stats.accepted
    # A draft needs a token after it: with two tokens or fewer no draft can be verified.
    if error_rate == 0.0 and len(serial.tokens) > 2 and depth > 1:
        assert stats.accepted > 0


def test_stop_token_ends_drafted_and_serial_at_the_same_token(tiny_targets):
    target = tiny_targets["llama"]
    params = xd.SamplingParams(temperature=1.0, seed=11)
    serial = xd.Generator(target).generate(PROMPTS[0], 80, params, stop_tokens=[])
    stop_token = serial.tokens[17]
    first = serial.tokens.index(stop_token)
    oracle = OracleDrafter(serial.tokens, 8, 0.0, 0)
    for generator in (xd.Generator(target), xd.Generator(target, oracle)):
        result = generator.generate(PROMPTS[0], 80, params, stop_tokens=[stop_token])
        assert result.tokens == serial.tokens[:first + 1]
        assert result.finish_reason == "stop" and result.stop == stop_token


def test_stop_strings_and_streaming(tiny_targets):
    target = tiny_targets["llama"]
    tokenizer = PieceTokenizer()
    params = xd.SamplingParams(temperature=0.8, seed=4)
    plain = xd.Generator(target, tokenizer=tokenizer).generate(PROMPTS[1], 60, params,
                                                              stop_tokens=[])
    text = plain.text
    stop = text[25:28]  # a string the run is known to produce
    cut = text.index(stop)
    oracle = OracleDrafter(plain.tokens, 6, 0.1, 1)
    results = []
    for generator in (xd.Generator(target, tokenizer=tokenizer),
                      xd.Generator(target, oracle, tokenizer=tokenizer)):
        chunks = list(generator.stream(PROMPTS[1], 60, params, stop=[stop, "zzzz"],
                                       stop_tokens=[]))
        result = chunks[-1].result
        assert result.finish_reason == "stop" and result.stop == stop
        assert result.text == text[:cut]
        assert "".join(c.text for c in chunks) == result.text
        assert sum((c.tokens for c in chunks), []) == result.tokens
        assert all(c.result is None for c in chunks[:-1])
        results.append(result.tokens)
    assert results[0] == results[1]
    # The run stops at the token that completes the stop string, not later.
    assert stop not in tokenizer.decode(results[0][:-1])
    assert stop in tokenizer.decode(results[0])


def test_text_prompt_and_stop_token_text_excluded(tiny_targets):
    generator = xd.Generator(tiny_targets["llama"], tokenizer=PieceTokenizer())
    result = generator.generate("abc abc ab", 40, xd.SamplingParams(temperature=1.2, seed=3),
                                stop_tokens=[0, 1, 2])
    assert result.prompt_tokens == PieceTokenizer().encode("abc abc ab")
    if result.finish_reason == "stop":
        assert result.text == PieceTokenizer().decode(result.tokens[:-1])


def test_context_limit_finishes_with_context(tiny_checkpoints):
    from exactdraft.pretrained import build_target, load_checkpoint

    target = build_target(load_checkpoint(tiny_checkpoints["llama"]), "torch", max_context=60)
    params = xd.SamplingParams(temperature=0.0)
    serial = xd.Generator(target).generate(PROMPTS[3], 100, params, stop_tokens=[])
    drafted = xd.Generator(target, xd.PromptLookup(min_match=1)).generate(
        PROMPTS[3], 100, params, stop_tokens=[])
    assert serial.finish_reason == drafted.finish_reason == "context"
    assert len(PROMPTS[3]) + len(serial.tokens) == 60
    assert drafted.tokens == serial.tokens


def test_seed_is_reported_and_replays(tiny_targets):
    generator = xd.Generator(tiny_targets["qwen3"], xd.PromptLookup())
    first = generator.generate(PROMPTS[0], 20, xd.SamplingParams(temperature=1.0))
    assert isinstance(first.seed, int)
    again = generator.generate(PROMPTS[0], 20, xd.SamplingParams(temperature=1.0,
                                                                seed=first.seed))
    assert again.tokens == first.tokens


def test_max_new_tokens_zero_and_length(tiny_targets):
    generator = xd.Generator(tiny_targets["llama"])
    assert generator.generate(PROMPTS[0], 0).tokens == []
    result = generator.generate(PROMPTS[0], 5, xd.SamplingParams(seed=1), stop_tokens=[])
    assert len(result.tokens) == 5 and result.finish_reason == "length"


@pytest.mark.parametrize("prompt,match", [
    ([], "empty"), ([1, 500], "500"), ([1, -3], "-3"), ("text", "tokenizer"),
    ([1.5], "1.5"), (list(range(100)) * 11, "context"),
])
def test_bad_prompts_are_refused_and_generator_recovers(tiny_targets, prompt, match):
    generator = xd.Generator(tiny_targets["llama"], xd.PromptLookup())
    params = xd.SamplingParams(temperature=0.5, seed=2)
    before = generator.generate(PROMPTS[0], 10, params)
    with pytest.raises(ValueError, match=match):
        generator.generate(prompt, 10, params)
    assert generator.generate(PROMPTS[0], 10, params).tokens == before.tokens


def test_bad_arguments_are_refused(tiny_targets):
    generator = xd.Generator(tiny_targets["llama"])
    with pytest.raises(ValueError, match="max_new_tokens"):
        generator.generate(PROMPTS[0], -1)
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        generator.generate(PROMPTS[0], 5, stop="x")
    with pytest.raises(ValueError, match="vocabulary"):
        xd.Generator(tiny_targets["llama"], xd.DraftModel(_OtherVocab()))


class _OtherVocab:
    vocab_size = 99
    max_context = 100


def test_drafter_proposing_bad_ids_fails_cleanly(tiny_targets):
    class Broken:
        max_draft = 3

        def begin(self, prompt, context):
            pass

        def propose(self, sequence, limit):
            return [1000]

        def accepted(self, proposed, accepted):
            pass

    generator = xd.Generator(tiny_targets["llama"], Broken())
    with pytest.raises(ValueError, match="1000"):
        generator.generate(PROMPTS[0], 5, xd.SamplingParams(seed=0))
