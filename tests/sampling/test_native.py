"""The C draw (exactdraft._sampler via exactdraft.sampling.native) against SAMPLER.md: golden
vectors, the literal reference of tests/sampling/test_keyed.py, the numpy path, every top-p
path of the extension, full-vocabulary rows, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactdraft.sampling import KeyedSampler, SamplingParams, gumbel_noise
from exactdraft.sampling import keyed as sampling
from exactdraft.sampling import native as sampling_native
from tests.sampling.test_keyed import GOLDEN_99, GOLDEN_1234, LOGITS, reference_sample

pytestmark = pytest.mark.skipif(not sampling_native.available(),
                                reason=str(sampling_native.unavailable_reason()))

MASK = (1 << 64) - 1
PATHS = {"auto": 0, "exhaustive": 1, "bounded": 2}


def native_module():
    from exactdraft import _sampler

    return _sampler


def processed(logits, params, history=(), n_prompt=None):
    history = np.asarray(history, dtype=np.int64)
    n_prompt = len(history) if n_prompt is None else n_prompt
    return KeyedSampler().processed(np.asarray(logits, dtype=np.float32), params, history,
                                    n_prompt)


def numpy_draw(x, params, pos):
    """The numpy path of exactdraft.sampling on a processed row."""
    if params.temperature == 0:
        return int(np.argmax(x))
    return sampling._gumbel_winner(*sampling._candidates(x, params), params.seed, pos)


def native_draws(x, params, pos):
    """The extension's token on every top-p path (they must agree)."""
    draw = native_module().draw
    return {name: draw(x, params.temperature, params.top_k, params.top_p, params.min_p,
                       params.seed or 0, pos & MASK, path) for name, path in PATHS.items()}


def path_counts():
    return np.array(native_module().top_p_path_counts())


@pytest.mark.parametrize("settings_,expected", GOLDEN_1234)
def test_golden_draws_seed_1234(settings_, expected):
    params = SamplingParams(seed=1234, **settings_)
    x = processed(LOGITS, params)
    got = [sampling_native.draw(x, params, pos) for pos in range(10, 26)]
    assert got == [int(t) for t in expected.split()]
    for pos in range(10, 26):
        assert set(native_draws(x, params, pos).values()) == {got[pos - 10]}


@pytest.mark.parametrize("settings_,expected", GOLDEN_99)
def test_golden_draws_with_history(settings_, expected):
    params = SamplingParams(seed=99, **settings_)
    history = [0, 3, 3, 6, 1]
    got = []
    for pos in range(5, 21):
        x = processed(LOGITS, params, history, n_prompt=2)
        got.append(sampling_native.draw(x, params, pos))
    assert got == [int(t) for t in expected.split()]


SPECIALS = [0.0, -0.0, 1.0, 2.5, -60.0, 1e-40, -1e-40, 3.0e38, -3.0e38, float("-inf")]


@st.composite
def logit_rows(draw):
    """float32 rows of 1..300 tokens: plain values, heavy ties, or a few special values."""
    size = draw(st.integers(1, 300))
    kind = draw(st.sampled_from(["plain", "ties", "specials"]))
    if kind == "ties":
        row = draw(st.lists(st.sampled_from([0.0, 1.0, 2.5, -1.0]), min_size=size,
                            max_size=size))
    else:
        row = draw(st.lists(st.floats(-30, 30, width=32), min_size=size, max_size=size))
    if kind == "specials":
        for index, value in draw(st.lists(st.tuples(st.integers(0, size - 1),
                                                    st.sampled_from(SPECIALS)), max_size=4)):
            row[index] = value
    return np.array(row, dtype=np.float32)


@settings(max_examples=400, deadline=None)
@given(row=logit_rows(),
       temperature=st.sampled_from([0.0, 0.05, 0.3, 0.7, 1.0, 1.5, 7.0, 1000.0]),
       top_k=st.sampled_from([0, 1, 2, 3, 50, 299]),
       top_p=st.sampled_from([1.0, 0.999, 0.9, 0.5, 0.01]),
       min_p=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
       repetition=st.sampled_from([1.0, 1.3, 0.7]), presence=st.sampled_from([0.0, 0.5]),
       bias=st.sampled_from([{}, {0: 0.1}, {0: -2.0}]),
       seed=st.integers(0, MASK), pos=st.integers(0, MASK),
       history=st.lists(st.integers(0, 3), max_size=8))
def test_matches_reference_and_numpy(row, temperature, top_k, top_p, min_p, repetition,
                                     presence, bias, seed, pos, history):
    history = [t for t in history if t < row.size]
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=repetition, presence_penalty=presence,
                            frequency_penalty=0.25, logit_bias=bias, seed=seed)
    x = processed(row, params, history, n_prompt=len(history) // 2)
    if temperature > 0 and not math.isfinite(float(np.max(x)) / temperature):
        with pytest.raises(ValueError, match="no finite maximum"):
            sampling_native.draw(x, params, pos)
        with pytest.raises(ValueError, match="no finite maximum"):
            numpy_draw(x, params, pos)
        return
    expected = reference_sample(row, params, pos, history, len(history) // 2)
    assert numpy_draw(x, params, pos) == expected
    assert native_draws(x, params, pos) == {name: expected for name in PATHS}


def realistic_row(seed: int, vocab: int = 49152) -> np.ndarray:
    """Shaped like a language model's logits: a wide bulk and a few strong tokens."""
    rng = np.random.default_rng(seed)
    row = rng.standard_normal(vocab) * 2.5 - 2.0
    row[rng.choice(vocab, 12, replace=False)] += rng.uniform(6.0, 14.0, 12)
    return row.astype(np.float32)


FULL_SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=0.7),
    dict(temperature=0.7, top_p=0.95),
    dict(temperature=0.7, top_k=50),
    dict(temperature=1.0, min_p=0.05),
    dict(temperature=1.0, top_k=1000, top_p=0.9),
    dict(temperature=1.5, top_p=0.99, min_p=0.01),
    dict(temperature=3.0, top_p=0.5),
]


@pytest.mark.parametrize("settings_", FULL_SETTINGS)
def test_full_vocabulary_rows(settings_):
    """The literal (pure Python) reference decides the first draw; numpy, which that draw and
    test_sampling check against the reference, decides the others, so the reference's
    per-token loop runs once per setting."""
    params = SamplingParams(seed=20240611, **settings_)
    for row_seed in (1, 2):
        row = realistic_row(row_seed)
        x = processed(row, params)
        before = x.tobytes()
        for pos in (0, 77):
            expected = numpy_draw(x, params, pos)
            if (row_seed, pos) == (1, 0):
                assert expected == reference_sample(row, params, pos, [], 0)
            assert native_draws(x, params, pos) == {name: expected for name in PATHS}
        assert x.tobytes() == before  # the row is only read


@pytest.mark.parametrize("settings_", FULL_SETTINGS)
def test_draw_among_listed_tokens_equals_the_banned_full_row(settings_):
    """draw_among on the listed tokens' values gives, on every top-p path, the token the
    plain draw gives for the full row with every other token banned; the noise follows the
    listed ids (negative control: the same values listed one id up draw differently)."""
    draw_among = native_module().draw_among
    params = SamplingParams(seed=77, **settings_)
    rng = np.random.default_rng(5)
    ids = np.sort(rng.choice(49152, 8192, replace=False)).astype(np.int64)
    values = realistic_row(3, vocab=8192)
    full = np.full(49152, sampling.BANNED, dtype=np.float32)
    full[ids] = values
    moved = 0
    for pos in (0, 41, 900):
        expected = native_draws(full.astype(np.float64), params, pos)["auto"]
        args = (params.temperature, params.top_k, params.top_p, params.min_p, params.seed, pos)
        for path in PATHS.values():
            assert ids[draw_among(values, ids, *args, path)] == expected
        shifted = ids + 1
        moved += shifted[draw_among(values, shifted, *args)] != expected + 1
    assert moved > 0 if params.temperature > 0 else moved == 0


def test_draw_among_refuses_bad_token_lists():
    draw_among = native_module().draw_among
    values = np.zeros(3, dtype=np.float32)
    for tokens, message in ((np.array([0, 2, 2]), "ascend strictly"),
                            (np.array([-1, 2, 3]), "ascend strictly"),
                            (np.array([0, 1]), "of 3 ids"),
                            (np.array([0, 1, 2], dtype=np.int32), "int64")):
        with pytest.raises(ValueError, match=message):
            draw_among(values, tokens, 1.0, 0, 1.0, 0.0, 1, 0)
    with pytest.raises(ValueError, match="NaN at token 9"):
        draw_among(np.array([0.0, np.nan, 1.0]), np.array([3, 9, 12]), 1.0, 0, 1.0, 0.0, 1, 0)


def test_bounded_top_p_decides_on_full_rows():
    """On a full-vocabulary row the bracket decides the cut without summing every candidate."""
    params = SamplingParams(temperature=0.7, top_p=0.95, seed=3)
    x = processed(realistic_row(5), params)
    before = path_counts()
    sampling_native.draw(x, params, 11)
    assert (path_counts() - before).tolist() == [0, 1, 0]


def test_bounded_top_p_falls_back_when_the_cut_is_within_the_bracket():
    """Two tied leaders and a long tail, with top_p putting the cut at the first prefix sum:
    the bracket cannot tell, the exhaustive sum decides, and all paths agree."""
    row = np.full(2000, -8.0, dtype=np.float32)
    row[[0, 1]] = 0.0
    total = 0.0
    for term in [1.0, 1.0] + [math.exp(-8.0)] * 1998:  # step 7's sequential sum
        total += term
    kept = set()
    for top_p in (1.0 / total * (1 - 1e-12), 1.0 / total, 1.0 / total * (1 + 1e-12)):
        params = SamplingParams(temperature=1.0, top_p=top_p, seed=8)
        x = processed(row, params)
        kept.add(1 if 1.0 >= top_p * total else 2)
        before = path_counts()
        for pos in range(6):
            expected = reference_sample(row, params, pos, [], 0)
            assert native_draws(x, params, pos) == {name: expected for name in PATHS}
        assert (path_counts() - before).tolist() == [6, 0, 12]  # exhaustive, auto fell back
    assert kept == {1, 2}


def reference_on_float64(x, params, pos):
    """Steps 3-9 of SAMPLER.md with no filters, literally, on a float64 row."""
    order = sorted(range(len(x)), key=lambda t: (-x[t], t))
    scores = [float(x[t]) / params.temperature + gumbel_noise(params.seed, pos, t)
              for t in order]
    return order[scores.index(max(scores))]


def test_near_and_exact_ties_are_decided_like_the_reference():
    """Token 1's score equals token 0's up to rounding, often exactly: the winner is the
    reference's, which on an exact tie is the one with the larger x."""
    tie_orders = set()
    for seed in range(300):
        g0, g1 = gumbel_noise(seed, 3, 0), gumbel_noise(seed, 3, 1)
        x = np.array([0.0, g0 - g1, -5.0])
        params = SamplingParams(temperature=1.0, seed=seed)
        if 0.0 + g0 == (g0 - g1) + g1:
            tie_orders.add(bool(x[1] > x[0]))
        expected = reference_on_float64(x, params, 3)
        assert sampling_native.draw(x, params, 3) == expected
        assert numpy_draw(x, params, 3) == expected
    assert tie_orders == {False, True}


def unmix(z: int) -> int:
    """The inverse of splitmix64's finalizer."""
    z = z ^ (z >> 31) ^ (z >> 62)
    z = (z * pow(0x94D049BB133111EB, -1, 1 << 64)) & MASK
    z = z ^ (z >> 27) ^ (z >> 54)
    z = (z * pow(0xBF58476D1CE4E5B9, -1, 1 << 64)) & MASK
    return z ^ (z >> 30) ^ (z >> 60)


def seed_with_unit_uniform(token: int) -> int:
    """A seed whose noise key at position 0 for `token` is 2**64 - 1, so u rounds to 1.0."""
    position_key = unmix(MASK) ^ token
    return (unmix(unmix(position_key)) - 0x9E3779B97F4A7C15) & MASK


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's inf - inf on the way to failing
def test_a_uniform_of_one_fails_where_numpy_fails():
    seed = seed_with_unit_uniform(5)
    assert sampling.noise_key(seed, 0, 5) == MASK
    assert sampling.keyed_uniform(seed, 0, [5])[0] == 1.0
    row = np.zeros(8, dtype=np.float32)
    row[5] = 1.0  # token 5 is kept: both paths refuse
    params = SamplingParams(temperature=1.0, seed=seed)
    x = processed(row, params)
    with pytest.raises(ValueError, match="token 5 rounds to 1.0"):
        sampling_native.draw(x, params, 0)
    with pytest.raises(ValueError):
        numpy_draw(x, params, 0)
    row[5] = -100.0  # far below the best: neither path evaluates its noise
    x = processed(row, params)
    assert sampling_native.draw(x, params, 0) == numpy_draw(x, params, 0)


@pytest.mark.parametrize("bad,message", [
    (np.array([0.0, 1.0, np.nan, 2.0, np.nan]), "NaN at token 2"),
    (np.zeros(4, dtype=np.float16), "float64 or float32"),
    (np.zeros(4, dtype=np.int64), "float64 or float32"),
    (np.array([0.0, np.nan], dtype=np.float32), "NaN at token 1"),
    (np.zeros(8)[::2], "C-contiguous"),
    (np.zeros((2, 3)), "1-D"),
    (np.zeros(0), "between 1 and"),
    ([0.0, 1.0], "C-contiguous"),
])
def test_bad_rows_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        sampling_native.draw(bad, SamplingParams(temperature=1.0, seed=1), 0)


@pytest.mark.parametrize("settings_", [s for s in FULL_SETTINGS if s["temperature"] > 0])
def test_float32_rows_are_widened_exactly(settings_):
    """A float32 row draws what its float64 widening draws (the extension widens it itself);
    the row is only read."""
    params = SamplingParams(seed=515, **settings_)
    row = (realistic_row(8) * np.float32(0.25)).astype(np.float32)  # several likely tokens
    before = row.tobytes()
    tokens = set()
    for pos in range(0, 60, 6):
        token = sampling_native.draw(row, params, pos)
        assert token == sampling_native.draw(row.astype(np.float64), params, pos) == \
            numpy_draw(row.astype(np.float64), params, pos)
        tokens.add(token)
    assert row.tobytes() == before
    assert len(tokens) > 1  # the positions' draws differ: the comparison can see a change


def test_plain_windows_skip_step_two_and_match_the_numpy_sampler(monkeypatch):
    """Without bias or penalties the sampler hands float32 rows to the extension as they are
    (processed() is never called) and writes the tokens the numpy sampler writes, drafts
    kept up to the first difference; with a penalty step 2 runs again."""
    rows = np.stack([realistic_row(20 + j) for j in range(5)])
    native, numpy_sampler = KeyedSampler(native=True), KeyedSampler(native=False)
    plain = SamplingParams(temperature=0.8, seed=6)
    history = list(range(40))
    reference = [numpy_sampler.sample(rows[j], plain, pos=40 + j, history=history)
                 for j in range(5)]
    drafts = reference[:3] + [(reference[3] + 1) % rows.shape[1]]

    def refuse(*args, **kwargs):
        raise AssertionError("processed() ran on a plain window")

    monkeypatch.setattr(native, "processed", refuse)
    got = native.sample_window(rows, plain, pos=40, history=history, drafts=drafts)
    assert got == reference[:4] == numpy_sampler.sample_window(rows, plain, pos=40,
                                                               history=history, drafts=drafts)
    penalised = SamplingParams(temperature=0.8, seed=6, repetition_penalty=1.3)
    with pytest.raises(AssertionError, match="processed"):
        native.sample_window(rows, penalised, pos=40, history=history, drafts=drafts)


@pytest.mark.parametrize("index,value,match", [
    (1, -0.5, "temperature"), (1, float("inf"), "temperature"), (2, -1, "top_k"),
    (3, 0.0, "top_p"), (3, 1.5, "top_p"), (4, -0.1, "min_p"), (4, float("nan"), "min_p"),
    (5, -1, "seed"), (5, 1 << 64, "seed"), (6, -1, "pos"), (7, 3, "top_p_path"),
])
def test_bad_arguments_name_the_value(index, value, match):
    args = [np.zeros(4), 1.0, 0, 1.0, 0.0, 1, 0, 0]
    args[index] = value
    with pytest.raises(ValueError, match=match):
        native_module().draw(*args)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow on the way to failing
def test_rows_without_a_finite_best_score():
    params = SamplingParams(temperature=1.0, seed=1)
    for row in (np.full(5, -np.inf), np.array([0.0, np.inf, 1.0]),
                np.array([1e300, 0.0])):
        scaled = SamplingParams(temperature=1e-10, seed=1) if row[0] == 1e300 else params
        with pytest.raises(ValueError, match="no finite maximum"):
            sampling_native.draw(row, scaled, 0)
        with pytest.raises(ValueError, match="no finite maximum"):
            numpy_draw(row, scaled, 0)
    greedy = SamplingParams.greedy()
    assert sampling_native.draw(np.array([0.0, np.inf, np.inf]), greedy, 0) == 1
    assert sampling_native.draw(np.array([-0.0, 0.0, -1.0]), greedy, 0) == 0


def test_missing_extension_is_reported(monkeypatch):
    monkeypatch.setattr(sampling_native, "_native", None)
    monkeypatch.setattr(sampling_native, "_UNAVAILABLE_REASON", "not built here")
    assert not sampling_native.available()
    assert sampling_native.unavailable_reason() == "not built here"
    with pytest.raises(sampling_native.NativeSamplerUnavailable, match="not built here"):
        sampling_native.draw(np.zeros(3), SamplingParams(seed=1), 0)


def test_unresolved_seed_is_refused():
    with pytest.raises(ValueError, match="seed"):
        sampling_native.draw(np.zeros(3), SamplingParams(temperature=1.0), 0)


def test_positions_wrap_like_the_python_key():
    params = SamplingParams(temperature=1.0, seed=11)
    x = processed(realistic_row(3, 500), params)
    for pos in (-1, -12345, 1 << 64, (1 << 70) + 5):
        assert sampling_native.draw(x, params, pos) == numpy_draw(x, params, pos)


def test_negative_control_platform_transcendentals_differ():
    """Why the sampler carries its own exp and log: on this machine numpy's SIMD exp and log
    round differently from the C library's on some inputs (premise measured; where the two
    libraries happen to agree the test says so and skips)."""
    values = -np.random.default_rng(0).random(20000) * 38.0
    uniforms = np.random.default_rng(1).random(20000)
    exp_differs = int(np.count_nonzero(np.exp(values) != [math.exp(v) for v in values.tolist()]))
    log_differs = int(np.count_nonzero(
        np.log(uniforms) != [math.log(v) for v in uniforms.tolist()]))
    if exp_differs == 0 and log_differs == 0:
        pytest.skip("measured: numpy's exp and log equal the C library's on all 40000 probes "
                    "on this machine")
    assert exp_differs + log_differs > 0


def test_negative_control_summation_order_changes_the_top_p_sum():
    """Step 7's sum depends on its order, so the extension's sort order is observable."""
    x = processed(realistic_row(4, 5000), SamplingParams(seed=0))
    terms = np.exp(x - x.max())
    in_order = 0.0
    for term in np.sort(terms)[::-1].tolist():
        in_order += term
    by_id = 0.0
    for term in terms.tolist():
        by_id += term
    assert in_order != by_id


def scan_draws(x, params, pos):
    """The draw's token with the best scan of the row this CPU runs, then with each scan it
    runs (scalar, AVX2, AVX-512)."""
    draw = native_module().draw
    return [draw(x, params.temperature, params.top_k, params.top_p, params.min_p,
                 params.seed or 0, pos & MASK, 0, scan) for scan in (0, *native_module().scans())]


@pytest.mark.parametrize("settings_", [dict(temperature=0.7), dict(temperature=1.5),
                                       dict(temperature=1.0, min_p=0.05),
                                       dict(temperature=4.0),
                                       dict(temperature=0.7, top_k=50),
                                       dict(temperature=0.9, top_p=0.95),
                                       dict(temperature=0.8, top_k=40, top_p=0.9)])
def test_simd_and_scalar_scans_give_the_same_token(settings_):
    """The draw scans the row (its maximum, and for the plain draw its hashes) with SIMD where
    it can; every scan and the numpy path give the same token at every position, and the
    tokens do vary with the position (negative control: the comparison can see a
    difference)."""
    params = SamplingParams(seed=77, **settings_)
    x = processed(realistic_row(5), params)
    tokens = []
    for pos in range(0, 400, 7):
        tokens_by_scan = scan_draws(x, params, pos)
        assert set(tokens_by_scan) == {numpy_draw(x, params, pos)}
        tokens.append(tokens_by_scan[0])
    assert len(set(tokens)) > 1


@pytest.mark.parametrize("settings_", [dict(temperature=1.0), dict(temperature=1.0, top_k=30),
                                       dict(temperature=1.0, top_p=0.9)])
def test_scans_agree_where_scores_are_divided_not_multiplied(settings_):
    """Scores beyond 2**40 make the draw divide instead of multiplying by 1 / T (the
    approximate product is off); every scan still gives the numpy path's token."""
    params = SamplingParams(seed=9, **settings_)
    x = processed(realistic_row(12), params) * 3e12
    for pos in range(0, 40, 3):
        assert set(scan_draws(x, params, pos)) == {numpy_draw(x, params, pos)}


@pytest.mark.parametrize("settings_", [dict(temperature=0.9, top_k=5),
                                       dict(temperature=0.9, top_p=0.9)])
def test_scans_agree_on_rows_that_end_inside_a_vector(settings_):
    """Rows whose length is no multiple of eight: the SIMD scans' last, partial vector."""
    params = SamplingParams(seed=21, **settings_)
    for length in (1, 7, 9, 23, 1001):
        x = processed((realistic_row(13, 2000)[:length] * np.float32(0.3)), params)
        x[-1] = x.max()  # a strong token in the last lanes
        for pos in range(4):
            assert set(scan_draws(x, params, pos)) == {numpy_draw(x, params, pos)}


def test_every_scan_finds_the_first_maximum_and_the_first_nan():
    """The row's maximum decides s0, and its first index breaks ties: rows whose maximum is
    repeated, sits in the tail past the last full vector, is -0.0 beside +0.0, or whose
    NaN comes after a larger value, give every scan the numpy path's token or error."""
    draw = native_module().draw
    rows = []
    bulk = realistic_row(9, 100).astype(np.float64)
    for length in (1, 7, 8, 9, 15, 16, 17, 23, 33, 100):
        row = bulk[:length].copy()
        row[-1] = row.max() + 1.0  # the maximum in the tail
        rows.append(row)
        tie = row.copy()
        tie[length // 2] = tie[-1]  # repeated: the first copy wins ties
        rows.append(tie)
    rows.append(np.array([-0.0, 0.0, -1.0] * 5))
    for row in rows:
        params = SamplingParams(temperature=0.7, seed=3)
        for pos in range(5):
            expected = numpy_draw(row, params, pos)
            for scan in native_module().scans():
                assert draw(row, 0.7, 0, 1.0, 0.0, 3, pos, 0, scan) == expected
        greedy = numpy_draw(row, SamplingParams(temperature=0.0), 0)  # the first maximum
        assert greedy == int(np.argmax(row))
        for scan in native_module().scans():
            assert draw(row, 0.0, 0, 1.0, 0.0, 3, 0, 0, scan) == greedy
    for first, second in ((17, 33), (3, 37), (36, 38), (1, 2)):  # in a block, in the tail
        nan_row = np.arange(40, dtype=np.float64)
        nan_row[[first, second]] = np.nan
        for scan in native_module().scans():
            for temperature in (0.7, 0.0):
                with pytest.raises(ValueError, match=f"NaN at token {first}$"):
                    draw(nan_row, temperature, 0, 1.0, 0.0, 3, 0, 0, scan)


def test_a_scan_this_cpu_lacks_is_refused():
    missing = [scan for scan in (1, 2, 3) if scan not in native_module().scans()]
    with pytest.raises(ValueError, match="scan must be"):
        native_module().draw(np.zeros(3), 0.7, 0, 1.0, 0.0, 3, 0, 0, 4)
    for scan in missing:
        with pytest.raises(ValueError, match=f"scan {scan} is not available"):
            native_module().draw(np.zeros(3), 0.7, 0, 1.0, 0.0, 3, 0, 0, scan)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("kept", [True, False])
def test_a_uniform_of_one_in_a_long_row_fails_only_when_kept(kept):
    """A token whose uniform rounds to 1.0, deep in a full row (inside the SIMD scan): the draw
    fails naming it when the token is kept, and is the numpy path's token when it is not."""
    token = 4097
    seed = seed_with_unit_uniform(token)
    row = realistic_row(6)
    row[token] = row.max() if kept else row.min() - 100.0
    params = SamplingParams(temperature=1.0, seed=seed)
    x = processed(row, params)
    for scan in native_module().scans():
        draw = native_module().draw
        arguments = (x, 1.0, 0, 1.0, 0.0, seed, 0, 0, scan)
        if kept:
            with pytest.raises(ValueError, match=f"token {token} rounds to 1.0"):
                draw(*arguments)
        else:
            assert draw(*arguments) == numpy_draw(x, params, 0)
