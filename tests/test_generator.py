"""Drafted generation equals serial generation, token for token, across the sampling space.

Every end-to-end check below compares more than tokens: through tests/exactness.py it compares
the bytes of the logits row behind each committed token in the drafted and the serial run, and
it fails if drafting was off or no draft was kept. Each check is a function of the target it
runs on; the negative controls at the end run the same functions on InexactTorchBackend (with
the guard off, so drafting runs) and show that each one fails there.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactdraft as xd
from tests.exactness import ExactnessCheck, OracleDrafter, recording_rows
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
FAMILIES = ["llama-tied", "llama3-rope", "mistral", "qwen2", "qwen2-window", "qwen3"]


# -- the checks, each a function of the target (and drafting model) it runs on -----------------

def sampling_grid(target, draft, guard, temperature, filter_name,
                  seeds=SEEDS) -> ExactnessCheck:
    """Seeds x {prompt lookup, suffix, draft model} at depths 1..8 for one setting."""
    serial = xd.Generator(target)
    check = ExactnessCheck()
    for seed in seeds:
        params = xd.SamplingParams(temperature=temperature, seed=seed, **FILTERS[filter_name])
        prompt = PROMPTS[seed % len(PROMPTS)]
        depth = 1 + seed % 8
        reference = check.serial_run(serial, prompt, 24, params, stop_tokens=[])
        assert len(reference[0].tokens) == 24
        # Fixed depth: the adaptive policy (tests/drafters/test_depth.py) would tie the counts of
        # kept and rejected drafts to timings.
        for drafter in (xd.PromptLookup(max_draft=depth, min_match=1),
                        xd.SuffixDrafter(max_draft=depth, min_match=1,
                                         speculation_factor=2.0),
                        xd.DraftModel(draft, max_draft=depth)):
            generator = xd.Generator(target, drafter, adaptive_depth=False, guard=guard)
            drafted, _ = check.compare(generator, prompt, 24, params, reference=reference,
                                       stop_tokens=[], label=f"{drafter!r} seed {seed}")
            assert drafted.seed == seed
    return check


def every_family(target, guard, temperatures=(0.0, 0.7, 1.5), seeds=range(4)) -> ExactnessCheck:
    serial = xd.Generator(target)
    lookup = xd.Generator(target, xd.PromptLookup(max_draft=5, min_match=1), guard=guard)
    self_drafted = xd.Generator(target, xd.DraftModel(target, max_draft=3), guard=guard)
    # One suffix drafter for all runs, so later runs also draft from earlier outputs.
    suffix = xd.Generator(target, xd.SuffixDrafter(max_draft=4, min_match=1), guard=guard)
    check = ExactnessCheck()
    for temperature in temperatures:
        for seed in seeds:
            params = xd.SamplingParams(temperature=temperature, top_p=0.95, seed=seed)
            prompt = PROMPTS[seed] * 2  # long enough to pass the sliding windows
            reference = check.serial_run(serial, prompt, 30, params, stop_tokens=[])
            for generator in (lookup, suffix, self_drafted):
                check.compare(generator, prompt, 30, params, reference=reference,
                              stop_tokens=[],
                              label=f"{generator.drafter!r} t={temperature} seed {seed}")
    return check


def oracle_drafts(target, guard, temperature, top_k, top_p, min_p, repetition, presence,
                  frequency, seed, depth, error_rate, prompt, max_new
                  ) -> tuple[ExactnessCheck, int]:
    """The check and the number of tokens the run wrote."""
    params = xd.SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                               repetition_penalty=repetition, presence_penalty=presence,
                               frequency_penalty=frequency, seed=seed)
    serial = xd.Generator(target)
    expected = serial.generate(prompt, max_new, params)
    oracle = OracleDrafter(expected.tokens, depth, error_rate, seed % 1000)
    generator = xd.Generator(target, oracle, adaptive_depth=False, guard=guard)
    check = ExactnessCheck()
    drafted, _ = check.compare(generator, prompt, max_new, params, serial=serial)
    stats = drafted.stats
    # Every pass commits its kept drafts and one token of the target's own.
    assert stats.target_passes <= len(drafted.tokens) - 1 <= stats.target_passes + stats.accepted
    return check, len(drafted.tokens)


def stop_token(target, guard) -> ExactnessCheck:
    params = xd.SamplingParams(temperature=1.0, seed=11)
    serial = xd.Generator(target)
    unstopped = serial.generate(PROMPTS[0], 80, params, stop_tokens=[])
    token = unstopped.tokens[17]
    first = unstopped.tokens.index(token)
    oracle = OracleDrafter(unstopped.tokens, 8, 0.0, 0)
    generator = xd.Generator(target, oracle, guard=guard)
    check = ExactnessCheck()
    drafted, reference = check.compare(generator, PROMPTS[0], 80, params, serial=serial,
                                       stop_tokens=[token])
    for result in (drafted, reference):
        assert result.tokens == unstopped.tokens[:first + 1]
        assert result.finish_reason == "stop" and result.stop == token
    return check


def stop_string_stream(target, guard) -> ExactnessCheck:
    tokenizer = PieceTokenizer()
    params = xd.SamplingParams(temperature=0.8, seed=4)
    serial = xd.Generator(target, tokenizer=tokenizer)
    plain = serial.generate(PROMPTS[1], 60, params, stop_tokens=[])
    text = plain.text
    stop = text[25:28]  # a string the run is known to produce
    cut = text.index(stop)
    oracle = OracleDrafter(plain.tokens, 6, 0.1, 1)
    drafted = xd.Generator(target, oracle, tokenizer=tokenizer, guard=guard)
    results, rows = [], []
    for generator, drafts in ((serial, False), (drafted, True)):
        with recording_rows(generator) as recorded:
            chunks = list(generator.stream(PROMPTS[1], 60, params, stop=[stop, "zzzz"],
                                           stop_tokens=[], drafts=drafts))
        result = chunks[-1].result
        assert result.finish_reason == "stop" and result.stop == stop
        assert result.text == text[:cut]
        assert "".join(c.text for c in chunks) == result.text
        assert sum((c.tokens for c in chunks), []) == result.tokens
        assert all(c.result is None for c in chunks[:-1])
        results.append(result)
        rows.append(recorded)
    check = ExactnessCheck()
    check.add(results[1], rows[1], results[0], rows[0])
    # The run stops at the token that completes the stop string, not later.
    assert stop not in tokenizer.decode(results[0].tokens[:-1])
    assert stop in tokenizer.decode(results[0].tokens)
    return check


def context_limit(target, guard) -> ExactnessCheck:
    """A target with a 60-token context; the drafts are the serial run's own tokens with some
    made wrong, so verify windows run up to the limit."""
    params = xd.SamplingParams(temperature=0.0)
    serial = xd.Generator(target)
    expected = serial.generate(PROMPTS[3], 100, params, stop_tokens=[])
    generator = xd.Generator(target, OracleDrafter(expected.tokens, 8, 0.1, 3), guard=guard,
                             adaptive_depth=False)
    check = ExactnessCheck()
    drafted, serial = check.compare(generator, PROMPTS[3], 100, params, serial=serial,
                                    stop_tokens=[])
    assert serial.finish_reason == drafted.finish_reason == "context"
    assert len(PROMPTS[3]) + len(serial.tokens) == 60
    return check


# -- on the exact backend ----------------------------------------------------------------------

@pytest.mark.parametrize("filter_name", sorted(FILTERS))
@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_drafted_equals_serial(tiny_targets, draft_target, temperature, filter_name):
    check = sampling_grid(tiny_targets["llama"], draft_target, True, temperature, filter_name)
    # Both branches of verification ran: drafts kept and drafts replaced.
    check.assert_exact(some_rejected=True)


@pytest.mark.parametrize("variant", FAMILIES)
def test_drafted_equals_serial_every_family(tiny_targets, variant):
    every_family(tiny_targets[variant], True).assert_exact()


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
    check, written = oracle_drafts(tiny_targets["llama"], True, temperature, top_k, top_p,
                                   min_p, repetition, presence, frequency, seed, depth,
                                   error_rate, prompt, max_new)
    # A draft needs a token after it: with two tokens or fewer no draft can be verified, and
    # wrong drafts may all be rejected. Drafting must have been on in every case.
    keeps = error_rate == 0.0 and written > 2 and depth > 1
    check.assert_exact(min_accepted=1 if keeps else 0)


def test_stop_token_ends_drafted_and_serial_at_the_same_token(tiny_targets):
    stop_token(tiny_targets["llama"], True).assert_exact()


def test_stop_strings_and_streaming(tiny_targets):
    stop_string_stream(tiny_targets["llama"], True).assert_exact()


def test_context_limit_finishes_with_context(tiny_checkpoints):
    from exactdraft.pretrained import build_target, load_checkpoint

    target = build_target(load_checkpoint(tiny_checkpoints["llama"]), "torch", max_context=60)
    context_limit(target, True).assert_exact()


# -- negative controls: every check above fails on a realistic non-invariant backend -----------

@pytest.mark.parametrize("temperature,filter_name", [(0.0, "plain"), (0.7, "combined"),
                                                     (1.5, "penalties")])
def test_negative_control_sampling_grid(inexact_targets, draft_target, temperature,
                                        filter_name):
    sampling_grid(inexact_targets(), draft_target, False, temperature, filter_name,
                  seeds=range(8)).assert_caught()


def test_negative_control_every_family(inexact_targets):
    every_family(inexact_targets("qwen2-window"), False, (0.0, 1.5), range(2)).assert_caught()


@pytest.mark.parametrize("temperature,error_rate,seed", [(0.0, 0.0, 1), (1.0, 0.2, 2**63),
                                                         (1.5, 0.6, 2)])
def test_negative_control_oracle_drafts(inexact_targets, temperature, error_rate, seed):
    check, _ = oracle_drafts(inexact_targets(), False, temperature, 40, 0.95, 0.02, 1.15, 0.4,
                             0.3, seed, 6, error_rate, PROMPTS[2], 30)
    check.assert_caught(min_fraction=1.0)


@pytest.mark.parametrize("check", [stop_token, stop_string_stream])
def test_negative_control_stops(inexact_targets, check):
    check(inexact_targets(), False).assert_caught(min_fraction=1.0)


def test_negative_control_context_limit(inexact_targets):
    context_limit(inexact_targets(max_context=60), False).assert_caught(min_fraction=1.0)


def test_token_comparison_alone_would_miss_the_inexact_backend(inexact_targets, draft_target):
    """Why the checks compare logits rows: on the same runs, the tokens agree."""
    check = sampling_grid(inexact_targets(), draft_target, False, 0.7, "combined",
                          seeds=range(8))
    assert check.token_mismatches == [] and check.flagged == len(check.row_mismatches) > 0


# -- stops, seeds and other generation details --------------------------------------------------

def test_text_prompt_and_stop_token_text_excluded(tiny_targets):
    tokenizer = PieceTokenizer()
    generator = xd.Generator(tiny_targets["llama"], tokenizer=tokenizer)
    params = xd.SamplingParams(temperature=1.2, seed=3)
    unstopped = generator.generate("abc abc ab", 40, params, stop_tokens=[])
    assert unstopped.prompt_tokens == tokenizer.encode("abc abc ab")
    # A token the run is known to produce, first produced after a few others.
    token = next(t for i, t in enumerate(unstopped.tokens)
                 if i >= 5 and t not in unstopped.tokens[:i] and tokenizer.decode([t]))
    first = unstopped.tokens.index(token)
    result = generator.generate("abc abc ab", 40, params, stop_tokens=[0, token])
    assert result.finish_reason == "stop" and result.stop == token
    assert result.tokens == unstopped.tokens[:first + 1]
    assert result.text == tokenizer.decode(result.tokens[:-1]) != tokenizer.decode(result.tokens)


def test_seed_is_reported_and_replays(tiny_targets):
    target = tiny_targets["qwen3"]
    first = xd.Generator(target).generate(PROMPTS[0], 20, xd.SamplingParams(temperature=1.0))
    assert isinstance(first.seed, int)
    # Replayed with drafts that are the first run's tokens, so the replay keeps drafts.
    oracle = OracleDrafter(first.tokens, 4, 0.0, 0)
    again = xd.Generator(target, oracle).generate(
        PROMPTS[0], 20, xd.SamplingParams(temperature=1.0, seed=first.seed))
    assert again.tokens == first.tokens
    assert again.stats.drafting and again.stats.accepted > 0


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
    params = xd.SamplingParams(temperature=0.0)  # greedy: this run keeps a draft
    before = generator.generate(PROMPTS[0], 10, params)
    assert before.stats.drafting and before.stats.accepted > 0
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


