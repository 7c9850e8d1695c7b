"""Constraints inside the decoding loop (exactdraft.constraints.rows) on the bundled SmolLM2:
drafted == serial, tokens and logprobs, under every constraint kind, with the drafter's drafts and
with the constraint's forced tokens as drafts; finish reasons; the Engine; and a negative control in
which verify rows get a stale mask (the mask of the committed prefix, not of their own)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.constraints.rows import FORCED_WINDOW
from exactdraft.decoding import Decoding
from exactdraft.engine import Engine
from exactdraft.verify import ExactVerifier

pytest.importorskip("llguidance")
from exactdraft.constraints import Constraint  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "address": {"type": "object",
                    "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["street", "zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "city", "address"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Describe Ada, 36, who lives at 1 Main Street (zip 0150) in "
                                   "Oslo, as JSON with name, age, city and address."}]
KINDS = {
    "json": Constraint.json_schema(PERSON),
    "regex": Constraint.regex(r"Ada is [0-9]{2} years old and lives in (Paris|Rome|Oslo)\."),
    "grammar": Constraint.grammar('start: "The answer is " ANSWER "."\nANSWER: "yes" | "no"'),
    "choices": Constraint.choices(["Oslo", "Paris", "Rome"]),
}
SAMPLINGS = [dict(temperature=0.0), dict(temperature=0.8, top_p=0.95),
             dict(temperature=1.0, top_k=40, repetition_penalty=1.1)]


@pytest.fixture(scope="module")
def generators(smollm2):
    target, tokenizer = smollm2
    with_lookup = xd.Generator(target, xd.PromptLookup(max_draft=6, min_match=1),
                               tokenizer=tokenizer, adaptive_depth=False, strict=True)
    alone = xd.Generator(target, tokenizer=tokenizer)
    return with_lookup, alone


def same(a, b) -> bool:
    return a.tokens == b.tokens and a.logprobs == b.logprobs and \
        a.finish_reason == b.finish_reason


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_drafted_equals_serial_under_every_constraint_kind(generators, kind):
    forced = 0
    for generator in generators:
        for seed, sampling in enumerate(SAMPLINGS):
            drafted = generator.generate(ASK, 60, seed=seed, constraint=KINDS[kind],
                                         logprobs=2, **sampling)
            serial = generator.generate(ASK, 60, seed=seed, constraint=KINDS[kind],
                                        logprobs=2, drafts=False, **sampling)
            assert same(drafted, serial), (kind, sampling, drafted.text, serial.text)
            assert serial.stats.drafted == 0
            forced += drafted.stats.forced
            assert drafted.finish_reason == "stop", drafted.text
    assert forced > 0  # the comparison covered passes that verified forced tokens


def test_outputs_validate_and_parse(generators):
    jsonschema = pytest.importorskip("jsonschema")
    generator = generators[0]
    for seed in range(4):
        result = generator.generate(ASK, 80, temperature=0.8, seed=seed,
                                    constraint=KINDS["json"])
        jsonschema.validate(result.json(), PERSON)
    text = generator.generate(ASK, 30, temperature=0.8, seed=1, constraint=KINDS["regex"]).text
    assert text.startswith("Ada is ") and text.endswith(".")


def test_forced_tokens_are_verified_drafts_and_cut_the_passes(generators):
    generator = generators[1]  # no drafter: every draft is a forced token
    drafted = generator.generate(ASK, 80, temperature=0.0, constraint=KINDS["json"])
    serial = generator.generate(ASK, 80, temperature=0.0, constraint=KINDS["json"],
                                drafts=False)
    assert drafted.tokens == serial.tokens
    assert drafted.stats.forced == drafted.stats.drafted > 0
    assert drafted.stats.target_passes < serial.stats.target_passes


def test_a_drafter_with_a_narrow_window_leaves_forced_runs_their_own_window(smollm2,
                                                                           monkeypatch):
    target, tokenizer = smollm2
    narrow = xd.Generator(target, xd.PromptLookup(max_draft=2, min_match=1),
                          tokenizer=tokenizer, adaptive_depth=False, strict=True)
    assert narrow.forced_window() == FORCED_WINDOW > narrow.max_draft
    widths = []
    plan = Decoding.plan

    def recording(self, *args, **kwargs):
        planned = plan(self, *args, **kwargs)
        if self.forced:
            widths.append(len(self.drafts))
        return planned

    monkeypatch.setattr(Decoding, "plan", recording)
    drafted = narrow.generate(ASK, 80, temperature=0.0, constraint=KINDS["json"])
    serial = narrow.generate(ASK, 80, temperature=0.0, constraint=KINDS["json"], drafts=False)
    assert drafted.tokens == serial.tokens
    assert max(widths) > narrow.max_draft  # forced runs wider than the drafter's drafts


def test_logprobs_are_of_the_constrained_distribution(generators):
    result = generators[1].generate(ASK, 8, temperature=0.7, seed=2,
                                    constraint=KINDS["choices"], logprobs=5)
    # The first token must open one of the choices: every reported alternative does too.
    first = result.logprobs[0]
    allowed_starts = ("O", "P", "R")
    tokenizer = generators[1].tokenizer
    for token, logprob in first.top:
        assert tokenizer.decode([token]).lstrip().startswith(allowed_starts), token
        assert np.isfinite(logprob)


def test_finish_reasons_incomplete_and_unsatisfiable(generators):
    generator = generators[0]
    short = generator.generate(ASK, 5, temperature=0.0, constraint=KINDS["json"])
    assert short.finish_reason == "incomplete"
    with pytest.raises(xd.ParameterError, match="incomplete"):
        short.json()
    # No stop token may end the text: once the choice is written nothing may follow, and the
    # complete match ends the generation.
    ended = generator.generate(ASK, 20, temperature=0.0, constraint=KINDS["choices"],
                               stop_tokens=[])
    assert ended.finish_reason == "stop" and ended.text in ("Oslo", "Paris", "Rome")
    # A grammar with no way to finish: after "Yes" nothing is allowed.
    no_end = Constraint.grammar('start: "Yes" b\nb: b "c"')
    stuck = generator.generate(ASK, 20, temperature=0.9, seed=4, constraint=no_end)
    assert stuck.finish_reason == "unsatisfiable" and stuck.text == "Yes"
    again = generator.generate(ASK, 20, temperature=0.9, seed=4, constraint=no_end,
                               drafts=False)
    assert same(stuck, again)


def test_constraint_shorthands_and_bad_constraints(generators):
    generator = generators[1]
    as_dict = generator.generate(ASK, 80, temperature=0.0, constraint=PERSON)
    as_spec = generator.generate(ASK, 80, temperature=0.0, constraint=KINDS["json"])
    assert as_dict.tokens == as_spec.tokens
    choice = generator.generate(ASK, 8, temperature=0.0, constraint=["Oslo", "Paris"])
    assert choice.text in ("Oslo", "Paris")
    with pytest.raises(xd.ParameterError, match="constraint must be"):
        generator.generate(ASK, 8, constraint=42)
    with pytest.raises(xd.ParameterError):
        generator.generate(ASK, 8, constraint={"type": "no-such-type"})


def test_the_engine_runs_constrained_requests_as_alone(generators):
    generator = generators[0]
    requests = [dict(constraint=KINDS[kind], temperature=0.8, seed=seed)
                for seed, kind in enumerate(sorted(KINDS))]
    alone = [generator.generate(ASK, 40, **request) for request in requests]
    with Engine(generator, max_sequences=4) as engine:
        together = engine.generate_batch([ASK], max_new_tokens=40, **requests[0])
        batch = [engine.submit(ASK, max_new_tokens=40, **request) for request in requests]
        results = [submission.results()[0] for submission in batch]
    assert together[0].tokens == alone[0].tokens
    for got, want in zip(results, alone):
        assert got.tokens == want.tokens, (got.text, want.text)


class StaleMaskVerifier(ExactVerifier):
    """The bug seen elsewhere: every row of a verify pass gets the mask of the committed
    prefix instead of its own."""

    def verify(self, rows, drafts, *, transform=None, history, **options):
        if transform is None:
            return super().verify(rows, drafts, history=history, **options)
        committed = list(history)
        stale = [transform(row, committed) for row in rows]
        return super().verify(np.stack(stale), drafts, history=history, **options)


def test_negative_control_a_stale_mask_on_verify_rows_breaks_exactness(smollm2):
    target, tokenizer = smollm2
    broken = xd.Generator(target, verifier=StaleMaskVerifier(), tokenizer=tokenizer)
    differing = 0
    for seed in range(6):
        try:
            drafted = broken.generate(ASK, 60, temperature=0.8, seed=seed,
                                      constraint=KINDS["json"])
        except xd.ParameterError:  # it drew a token the constraint forbids there
            differing += 1
            continue
        serial = broken.generate(ASK, 60, temperature=0.8, seed=seed,
                                 constraint=KINDS["json"], drafts=False)
        differing += drafted.tokens != serial.tokens
        if drafted.finish_reason == "stop":
            try:
                json.loads(drafted.text)
            except json.JSONDecodeError:
                differing += 1
    assert differing > 0


def awkward_row(rng, size, dtype=np.float32):
    """Logits with NaN, -0.0, +-inf and huge values among normal ones."""
    row = rng.standard_normal(size).astype(dtype)
    spots = rng.choice(size, 400, replace=False)
    row[spots[:100]] = np.nan
    row[spots[100:200]] = -0.0
    row[spots[200:300]] = np.inf
    row[spots[300:]] = -np.inf
    row[rng.choice(size, 50)] = np.finfo(np.float32).max
    return row


def walk_rows(smollm2, mutate=None):
    """ConstraintRows' rows along a generated JSON text against apply_mask's, bit for bit;
    returns how many rows took each way (few allowed ids, few forbidden ids, neither)."""
    from exactdraft.constraints import apply_mask
    from exactdraft.constraints.rows import ConstraintRows

    target, tokenizer = smollm2
    schema = {"type": "object", "properties": {"note": {"type": "string", "maxLength": 37},
                                               "n": {"type": "integer"}},
              "required": ["note", "n"], "additionalProperties": False}
    constraint = Constraint.json_schema(schema)
    text = '{"note": "a free text, with some words in it", "n": 31}'
    tokens = tokenizer.encode(text, add_special_tokens=False)
    matcher = constraint.matcher(tokenizer, target.vocab_size, tokenizer.stop_token_ids)
    rows = ConstraintRows(matcher, n_prompt=3)
    reference = constraint.matcher(tokenizer, target.vocab_size, tokenizer.stop_token_ids)
    rng = np.random.default_rng(0)
    ways = {"allowed": 0, "forbidden": 0, "neither": 0}
    history = [7, 8, 9]
    for index, token in enumerate(tokens):
        raw = awkward_row(rng, target.vocab_size, np.float64 if index % 5 == 4 else np.float32)
        kept = raw.copy()
        got = rows(raw, history)
        want = apply_mask(raw, reference.allowed())
        if mutate is not None:
            got = mutate(got)
        assert got.dtype == np.float32 and got.tobytes() == want.tobytes(), index
        assert raw.tobytes() == kept.tobytes()  # the input row is not written
        got[:] = 0.0  # a fresh array: nothing the next row is built from
        ways["allowed" if matcher.allowed_ids() is not None else
             "forbidden" if matcher.forbidden_ids() is not None else "neither"] += 1
        history.append(token)
        reference.consume(token)
    return ways


def test_constraint_rows_are_apply_mask_bit_for_bit(smollm2):
    ways = walk_rows(smollm2)
    assert all(ways.values()), ways


def test_negative_control_a_row_masked_by_adding_zero_is_caught(smollm2):
    """row + 0 turns -0.0 into +0.0 (and keeps NaN where -inf belongs): the comparison sees it."""
    def add_zero(row):
        return (row + np.float32(0.0)).astype(np.float32)

    with pytest.raises(AssertionError):
        walk_rows(smollm2, add_zero)
