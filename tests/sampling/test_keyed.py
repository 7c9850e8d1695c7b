"""KeyedSampler against SAMPLER.md: golden vectors, a literal reference, and validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactdraft.errors import ParameterError
from exactdraft.sampling import (
    KeyedSampler,
    SamplingParams,
    gumbel_noise,
    keyed_uniform,
    noise_key,
)
from exactdraft.sampling import native as sampling_native

LOGITS = np.array([2.0, 1.0, 0.5, 2.0, -1.0, 0.0, 1.5, 0.25], dtype=np.float32)

# Every sampling test runs on the numpy path and on the C extension (skipped if it is not built).
DRAW_PATHS = [pytest.param(False, id="numpy"),
              pytest.param(True, id="native", marks=pytest.mark.skipif(
                  not sampling_native.available(),
                  reason=str(sampling_native.unavailable_reason())))]


def draws(params, positions, history=(), n_prompt=None, native=False):
    sampler = KeyedSampler(native=native)
    return [sampler.sample(LOGITS, params, pos=p, history=history, n_prompt=n_prompt)
            for p in positions]


@pytest.mark.parametrize("seed,pos,tok,key,u", [
    (0, 0, 0, 0x33fe8bd4f9c57863, 0.20310281705476102),
    (42, 7, 3, 0x93262a4b77f53d1b, 0.574801104950855),
    (2**64 - 1, 123456, 151935, 0x28e5cf218744d4e8, 0.15975660866321856),
])
def test_golden_keys_and_uniforms(seed, pos, tok, key, u):
    assert noise_key(seed, pos, tok) == key
    assert keyed_uniform(seed, pos, [tok])[0] == u


def test_golden_gumbel():
    assert gumbel_noise(0, 0, 0) == -0.4662735186548661
    assert gumbel_noise(42, 7, 3) == 0.5910759041008717


GOLDEN_1234 = [
    (dict(temperature=0), "0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0"),
    (dict(temperature=1.0), "3 3 3 0 1 0 6 0 6 1 0 6 6 6 3 3"),
    (dict(temperature=0.7, top_k=3), "3 3 3 0 0 0 6 0 0 3 0 6 6 6 3 3"),
    (dict(temperature=1.0, top_p=0.5), "3 3 3 0 0 0 0 0 0 3 0 3 3 0 3 3"),
    (dict(temperature=1.5, min_p=0.4), "3 1 3 0 1 0 6 0 6 1 0 6 6 6 3 1"),
    # top-p's mass is over the top-k kept: dropping either filter changes the row.
    (dict(temperature=1.5, top_k=4, top_p=0.8), "3 3 3 0 0 0 6 0 6 3 0 6 6 6 3 3"),
]

GOLDEN_99 = [
    (dict(temperature=1.0, repetition_penalty=3.0), "0 3 6 1 0 5 1 3 3 1 1 0 3 0 7 1"),
    (dict(temperature=1.0, presence_penalty=0.5, frequency_penalty=0.25),
     "0 3 6 1 0 0 6 3 3 0 1 0 3 0 7 1"),
    (dict(temperature=0.8, logit_bias={4: 3.0, 0: -1.0}), "0 3 6 1 4 6 6 3 3 3 1 4 4 0 7 1"),
]


@pytest.mark.parametrize("native", DRAW_PATHS)
@pytest.mark.parametrize("settings_,expected", GOLDEN_1234)
def test_golden_draws_seed_1234(settings_, expected, native):
    params = SamplingParams(seed=1234, **settings_)
    assert draws(params, range(10, 26), native=native) == [int(t) for t in expected.split()]


@pytest.mark.parametrize("native", DRAW_PATHS)
@pytest.mark.parametrize("settings_,expected", GOLDEN_99)
def test_golden_draws_with_history(settings_, expected, native):
    params = SamplingParams(seed=99, **settings_)
    got = draws(params, range(5, 21), history=[0, 3, 3, 6, 1], n_prompt=2, native=native)
    assert got == [int(t) for t in expected.split()]


def without(settings_: dict, feature: str) -> dict:
    """The settings with one feature off (one logit_bias entry counts as a feature)."""
    if feature.startswith("logit_bias:"):
        token = int(feature.split(":")[1])
        return dict(settings_, logit_bias={t: b for t, b in settings_["logit_bias"].items()
                                           if t != token})
    return {name: value for name, value in settings_.items() if name != feature}


def features(settings_: dict) -> list[str]:
    named = [name for name in settings_ if name != "temperature"]
    return named + [f"logit_bias:{t}" for t in settings_.get("logit_bias", {})]


@pytest.mark.parametrize("settings_,expected", GOLDEN_1234 + GOLDEN_99)
def test_every_golden_row_needs_each_of_its_features(settings_, expected):
    """A sampler that ignored any feature a golden row names would fail that row: with the
    feature off, the same seed and positions give another row."""
    history, positions, seed = ((), range(10, 26), 1234) if (settings_, expected) in \
        GOLDEN_1234 else ([0, 3, 3, 6, 1], range(5, 21), 99)
    n_prompt = 2 if history else None
    assert draws(SamplingParams(seed=seed, **settings_), positions, history,
                 n_prompt) == [int(t) for t in expected.split()]
    assert features(settings_) or settings_["temperature"] == 0 or \
        settings_ == {"temperature": 1.0}
    for feature in features(settings_):
        params = SamplingParams(seed=seed, **without(settings_, feature))
        assert draws(params, positions, history, n_prompt) != \
            [int(t) for t in expected.split()], feature


def test_repetition_penalty_row_covers_prompt_tokens():
    """The repetition penalty applies to the prompt's tokens too: a sampler that penalised
    only the output part [3, 3, 6, 1] (token 0 is in the prompt alone) fails the row. The
    keys do not depend on the history, so handing the sampler that part as the whole history
    is such a sampler."""
    settings_, expected = GOLDEN_99[0]
    assert set(settings_) == {"temperature", "repetition_penalty"}
    params = SamplingParams(seed=99, **settings_)
    assert draws(params, range(5, 21), [0, 3, 3, 6, 1], 2) == [int(t) for t in expected.split()]
    assert draws(params, range(5, 21), [3, 3, 6, 1], 0) != [int(t) for t in expected.split()]


def golden_tables_in_the_docs() -> list[tuple[str, str]]:
    """(parameters, tokens) of every row of the draw tables in docs/SAMPLER.md."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "SAMPLER.md").read_text()
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[1] and set(cells[1]) <= set("0123456789 "):
            rows.append((cells[0], cells[1]))
    return rows


def describe_settings(settings_: dict) -> str:
    """A golden row's parameters as docs/SAMPLER.md writes them."""
    names = {"presence_penalty": "presence", "frequency_penalty": "frequency"}
    parts = []
    for name, value in settings_.items():
        if name == "logit_bias":
            entries = ", ".join(f"{t}: {b:+}" for t, b in value.items())
            parts.append(f"logit_bias {{{entries}}}")
        else:
            parts.append(f"{names.get(name, name)} {value}")
    return ", ".join(parts)


def test_docs_hold_the_same_golden_rows():
    from tests.constraints.test_constraint import GOLDEN_MASKED, GOLDEN_MASKED_99

    # The plain draws' tables, then the masked draws' (tests/constraints/test_constraint.py
    # checks those).
    expected = [(describe_settings(s), t)
                for s, t in GOLDEN_1234 + GOLDEN_99 + GOLDEN_MASKED + GOLDEN_MASKED_99]
    assert golden_tables_in_the_docs() == expected


def reference_sample(logits, params, pos, history, n_prompt):
    """SAMPLER.md transcribed literally: full sort, Python math, no shortcuts."""
    x = [float(v) for v in np.asarray(logits, dtype=np.float32)]
    for token, bias in params.logit_bias.items():
        x[token] += bias
    if params.repetition_penalty != 1.0:
        for t in set(history):
            penalty = params.repetition_penalty
            x[t] = x[t] / penalty if x[t] > 0 else x[t] * penalty
    output = list(history[n_prompt:])
    for t in set(output):
        x[t] -= params.presence_penalty + params.frequency_penalty * output.count(t)
    if params.temperature == 0:
        return max(range(len(x)), key=lambda t: (x[t], -t))
    order = sorted(range(len(x)), key=lambda t: (-x[t], t))
    if 0 < params.top_k < len(x):
        order = order[:params.top_k]
    s = [x[t] / params.temperature for t in order]
    if params.top_p < 1:
        e = [math.exp(v - s[0]) for v in s]
        c = list(np.cumsum(e))
        n = next(i for i, v in enumerate(c) if v >= params.top_p * c[-1])
        order, s = order[:n + 1], s[:n + 1]
    if params.min_p > 0:
        keep = [i for i, v in enumerate(s) if v >= s[0] + math.log(params.min_p)]
        order, s = [order[i] for i in keep], [s[i] for i in keep]
    scores = [v + gumbel_noise(params.seed, pos, t) for v, t in zip(s, order)]
    return order[scores.index(max(scores))]


logit_rows = st.integers(2, 300).flatmap(lambda v: st.lists(
    st.one_of(st.floats(-30, 30, width=32), st.sampled_from([0.0, 1.0, 2.5, -60.0])),
    min_size=v, max_size=v))


@pytest.mark.parametrize("native", DRAW_PATHS)
@settings(max_examples=300, deadline=None)
@given(row=logit_rows, temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5, 7.0]),
       top_k=st.sampled_from([0, 1, 3, 50]), top_p=st.sampled_from([1.0, 0.9, 0.5, 0.01]),
       min_p=st.sampled_from([0.0, 0.05, 0.5]),
       repetition=st.sampled_from([1.0, 1.3, 0.7]),
       presence=st.sampled_from([0.0, 0.5]), frequency=st.sampled_from([0.0, 0.25]),
       seed=st.integers(0, 2**64 - 1), pos=st.integers(0, 10**6),
       history=st.lists(st.integers(0, 1), max_size=12), n_prompt_fraction=st.floats(0, 1))
def test_matches_literal_reference(native, row, temperature, top_k, top_p, min_p, repetition,
                                   presence, frequency, seed, pos, history, n_prompt_fraction):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=repetition, presence_penalty=presence,
                            frequency_penalty=frequency, logit_bias={1: 0.5}, seed=seed)
    logits = np.array(row, dtype=np.float32)
    n_prompt = int(n_prompt_fraction * len(history))
    ours = KeyedSampler(native=native).sample(logits, params, pos=pos, history=history,
                                              n_prompt=n_prompt)
    assert ours == reference_sample(logits, params, pos, history, n_prompt)


@pytest.mark.parametrize("native", DRAW_PATHS)
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**63), temperature=st.sampled_from([0.0, 0.7, 1.0]),
       presence=st.sampled_from([0.0, 0.8]), width=st.integers(1, 9), data=st.data())
def test_window_equals_rows_sampled_alone(native, seed, temperature, presence, width, data):
    rng = np.random.default_rng(seed % 2**32)
    rows = (rng.standard_normal((width, 64)) * 3).astype(np.float32)
    history = rng.integers(0, 64, 10).tolist()
    params = SamplingParams(temperature=temperature, presence_penalty=presence, seed=seed)
    sampler = KeyedSampler(native=native)
    alone = []
    for j in range(width):
        alone.append(sampler.sample(rows[j], params, pos=10 + j, history=history + alone,
                                    n_prompt=4))
    # Drafts equal to the row samples are all accepted; a wrong draft stops the window there.
    assert sampler.sample_window(rows, params, pos=10, history=history, n_prompt=4,
                                 drafts=alone[:-1]) == alone
    wrong_at = data.draw(st.integers(0, width - 1))
    if wrong_at < width - 1:
        drafts = list(alone[:-1])
        drafts[wrong_at] = (drafts[wrong_at] + 1) % 64
        window = sampler.sample_window(rows, params, pos=10, history=history, n_prompt=4,
                                       drafts=drafts)
        assert window == alone[:wrong_at + 1]


@pytest.mark.parametrize("native", DRAW_PATHS)
@settings(max_examples=200, deadline=None)
@given(row=logit_rows, temperature=st.sampled_from([0.0, 0.3, 0.7, 1.5]),
       top_k=st.sampled_from([0, 1, 3, 50]), top_p=st.sampled_from([1.0, 0.9, 0.3]),
       min_p=st.sampled_from([0.0, 0.1]), presence=st.sampled_from([0.0, 0.5]),
       bias=st.booleans(), seed=st.integers(0, 2**64 - 1), pos=st.integers(0, 10**6),
       vocab_extra=st.integers(0, 400), near_ban=st.booleans(), data=st.data())
def test_sample_among_equals_the_banned_full_row(native, row, temperature, top_k, top_p,
                                                 min_p, presence, bias, seed, pos,
                                                 vocab_extra, near_ban, data):
    """The fast path (no bias, no penalty) and the fallback both give what `sample` gives
    for the full row with every token outside `ids` banned."""
    from exactdraft.sampling.params import BANNED

    vocab = len(row) + vocab_extra
    ids = np.sort(np.asarray(data.draw(st.lists(st.integers(0, vocab - 1), min_size=len(row),
                                                max_size=len(row), unique=True)), np.int64))
    # near_ban: values within the noise's reach of the ban, where only the full row will do.
    values = np.array(row, dtype=np.float32) + np.float32(BANNED if near_ban else 0)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            presence_penalty=presence, logit_bias={int(ids[0]): 1.5} if bias
                            else {}, seed=seed)
    history = [int(ids[-1]), 0, int(ids[0])]
    sampler = KeyedSampler(native=native)
    full = np.full(vocab, BANNED, dtype=np.float32)
    full[ids] = values
    expected = sampler.sample(full, params, pos=pos, history=history, n_prompt=1)
    assert sampler.sample_among(values, ids, vocab, params, pos=pos, history=history,
                                n_prompt=1) == expected


def test_sample_among_sees_the_ids_and_refuses_bad_ones():
    """Negative control: the same values under other token ids draw other tokens (the keys
    follow the ids), and ids that are unsorted, repeated or outside the vocabulary raise."""
    rng = np.random.default_rng(3)
    values = (rng.standard_normal(200) * 2).astype(np.float32)
    ids = np.arange(0, 400, 2)
    sampler = KeyedSampler()
    moved = 0
    for seed in range(20):
        params = SamplingParams(temperature=1.0, seed=seed)
        first = sampler.sample_among(values, ids, 400, params, pos=7)
        second = sampler.sample_among(values, ids + 1, 400, params, pos=7)
        moved += second != first + 1  # not the same draw, one id over
    assert moved > 0
    params = SamplingParams(temperature=1.0, seed=1)
    for bad in (ids[::-1].copy(), np.array([0, 2, 2]), np.array([0, 400])):
        with pytest.raises(ParameterError, match="ids must ascend"):
            sampler.sample_among(values[:len(bad)], bad, 400, params, pos=7)


def test_near_and_exact_ties_follow_the_sorted_order():
    """Scores that agree to float rounding are compared as computed (the noise has the same
    bits everywhere), and an exact tie goes to the candidate that comes first."""
    from exactdraft.sampling import keyed as sampling

    exact_ties = 0
    for seed in range(200):
        g0, g1 = gumbel_noise(seed, 3, 0), gumbel_noise(seed, 3, 1)
        s = np.array([0.0, g0 - g1])  # scores 0 + g0 and (g0 - g1) + g1: equal up to rounding
        scores = [0.0 + g0, (g0 - g1) + g1]
        exact_ties += scores[0] == scores[1]
        expected = 0 if scores[0] >= scores[1] else 1
        assert sampling._gumbel_winner(np.array([0, 1]), s, seed, 3) == expected
        assert sampling._gumbel_winner(np.array([1, 0]), s[::-1].copy(), seed, 3) == (
            1 if scores[1] >= scores[0] else 0)
    assert exact_ties > 0  # the tie branch ran


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5),
    ("top_k", -1), ("top_k", 2.5), ("min_p", -0.1), ("min_p", 1.01),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("seed", -1), ("seed", 2**64),
    ("presence_penalty", float("inf")),
])
def test_invalid_params_name_the_value(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_invalid_logit_bias():
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={-1: 1.0})
    params = SamplingParams(logit_bias={100: 1.0}, seed=0)
    with pytest.raises(ValueError, match="100"):
        KeyedSampler().sample(LOGITS, params, pos=0)


def test_unresolved_seed_is_refused_and_with_seed_resolves():
    with pytest.raises(ValueError, match="seed"):
        KeyedSampler().sample(LOGITS, SamplingParams(temperature=1.0), pos=0)
    resolved = SamplingParams(temperature=1.0).with_seed()
    assert 0 <= resolved.seed < 2**63
    assert SamplingParams(seed=3).with_seed().seed == 3


def test_nan_logits_are_refused():
    row = LOGITS.copy()
    row[2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        KeyedSampler().sample(row, SamplingParams(seed=0), pos=0)


def test_every_draw_refuses_an_unresolved_seed_in_one_wording():
    """A sampled draw needs its seed resolved first (SamplingParams.check_drawable, the one
    check every path makes); a greedy one does not need a seed at all (the control)."""
    row = np.array([0.5, 2.0, 1.0], np.float32)
    unseeded = SamplingParams(temperature=0.7)
    wording = r"params.seed is None: resolve one first with params.with_seed\(\)"
    sampler = KeyedSampler()
    calls = [lambda: sampler.sample(row, unseeded, pos=3),
             lambda: sampler.sample_among(row, np.arange(3), 3, unseeded, pos=3),
             lambda: sampler.sample_window(row[None], unseeded, pos=3, history=[])]
    if sampling_native.available():
        calls.append(lambda: sampling_native.draw(row.astype(np.float64), unseeded, 3))
    for call in calls:
        with pytest.raises(ParameterError, match=wording):
            call()
    assert sampler.sample(row, SamplingParams(temperature=0), pos=3) == 1
