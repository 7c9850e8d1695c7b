"""Forced Harmony calls with a tokenizer whose markers are special tokens, as gpt-oss's
(o200k_harmony) has them: the call grammar names the markers as tokens, so the tokens a model
writes for a call (the markers' ids, <|call|> the stop token at the end) are exactly what it
allows, and their text reads back through the reasoning splitter and the call reader; through
the server, a forced call (named and required) on the tiny llama with that tokenizer and the
Harmony template returns a parsed call whose arguments validate, streamed as whole. Negative
controls: the text-form grammar (the markers as text) refuses the marker ids and writes the
markers in characters for that tokenizer, in the constraint and through the server."""

from __future__ import annotations

import json
import os
import shutil

import jsonschema
import pytest

import exactdraft as xd
from exactdraft.errors import ConstraintError
from exactdraft.loading.builtin_templates import chat_template_source
from exactdraft.loading.tokenizer import Tokenizer
from exactdraft.server.reasoning.formats import split_whole
from exactdraft.server.reasoning.harmony import HarmonySplitter
from exactdraft.server.tool_calls import requests
from exactdraft.server.tool_calls.formats import constraint_grammar, format_named, parse_tool_calls
from exactdraft.server.tool_calls.harmony import SPECIAL_MARKERS, markers_are_special
from tests.server.live import post, server_in_thread
from tests.server.reasoning.test_replies import stream, streamed_blocks

pytest.importorskip("llguidance")

from exactdraft.constraints import Constraint  # noqa: E402

# o200k_harmony's control tokens the Harmony format writes (<|return|> is gpt-oss's eos).
HARMONY_SPECIALS = ("<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
                    "<|message|>", "<|call|>", "<|endoftext|>")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
           "required": ["city"], "additionalProperties": False}
FUNCTIONS = [{"name": "get_weather", "parameters": WEATHER},
             {"name": "now", "parameters": {"type": "object",
                                            "properties": {"utc": {"type": "boolean"}}}}]
TOOLS = [{"type": "function", "function": f} for f in FUNCTIONS]
SCHEMAS = {f["name"]: f["parameters"] for f in FUNCTIONS}
ASK = [{"role": "user", "content": "Hi"}]


def write_harmony_tokenizer(folder: str, vocab_size: int) -> None:
    """The tiny models' character-level tokenizer.json with Harmony's markers as added special
    tokens (one id each, as o200k_harmony has them) and <|return|> as eos."""
    from tokenizers import Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    pieces = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    pieces += list(HARMONY_SPECIALS)
    pieces += [f"<extra_{i}>" for i in range(vocab_size - len(pieces))]
    backend = Backend(models.WordLevel({p: i for i, p in enumerate(pieces)}, "<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(["<unk>", "<s>", "</s>", *HARMONY_SPECIALS])
    backend.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as handle:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|return|>",
                   "unk_token": "<unk>", "add_bos_token": False}, handle)


@pytest.fixture(scope="module")
def harmony_folder(tiny_checkpoints, tmp_path_factory):
    """The tiny llama's weights with the Harmony tokenizer."""
    folder = str(tmp_path_factory.mktemp("harmony-llama"))
    source = tiny_checkpoints["llama"]
    for name in os.listdir(source):
        if not name.startswith("tokenizer"):
            shutil.copy(os.path.join(source, name), folder)
    with open(os.path.join(source, "config.json")) as handle:
        write_harmony_tokenizer(folder, json.load(handle)["vocab_size"])
    return folder


@pytest.fixture(scope="module")
def harmony_tokenizer(harmony_folder):
    tokenizer = Tokenizer.from_folder(harmony_folder)
    tokenizer.use_chat_template(chat_template_source("harmony"))
    return tokenizer


def test_the_markers_are_special_tokens_and_call_is_a_stop(harmony_tokenizer, tiny_checkpoints):
    assert markers_are_special(harmony_tokenizer)
    ids = [harmony_tokenizer.encode(marker) for marker in SPECIAL_MARKERS]
    assert all(len(one) == 1 for one in ids)  # one token each, not their characters
    call = harmony_tokenizer.backend.token_to_id("<|call|>")
    end = harmony_tokenizer.backend.token_to_id("<|end|>")
    assert call in harmony_tokenizer.stop_token_ids and end not in harmony_tokenizer.stop_token_ids
    # The control: the tiny llama's tokenizer spells the markers in characters.
    assert not markers_are_special(Tokenizer.from_folder(tiny_checkpoints["llama"]))


ANALYSIS = "<|channel|>analysis<|message|>Need the <|end tool.<|end|><|start|>assistant"
CALL = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Paris"}')
NOW = "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}"


def special_constraint(choice: str, parallel: bool = False) -> Constraint:
    grammar = constraint_grammar(format_named("harmony"), FUNCTIONS, choice, parallel, True)
    return Constraint.grammar(grammar, special_tokens=SPECIAL_MARKERS)


def walk(constraint: Constraint, tokenizer: Tokenizer, ids: list[int]) -> tuple[int, bool]:
    """(how many of `ids` the constraint allows in a row, whether they end complete: the
    last a stop token it allows or the text a whole match)."""
    matcher = constraint.matcher(tokenizer, tokenizer.vocab_size, tokenizer.stop_token_ids)
    allowed = matcher.valid_prefix(ids)
    for token in ids[:allowed]:
        matcher.consume(token)
    return allowed, matcher.complete


@pytest.mark.parametrize("choice, text, accepted", [
    ("get_weather", CALL + "<|call|>", True),
    ("get_weather", CALL, True),  # any stop token may end it where the grammar may
    ("get_weather", ANALYSIS + CALL + "<|call|>", True),
    ("get_weather", NOW + "<|call|>", False),  # a named choice: that function only
    ("get_weather", CALL.replace('"Paris"', "7") + "<|call|>", False),
    ("get_weather", CALL[:-1] + "<|call|>", False),  # the stop before the arguments end
    ("get_weather", "<|channel|>final<|message|>It rains.<|return|>", False),
    ("required", NOW + "<|call|>", True),
    ("required", ANALYSIS + CALL + "<|call|>", True),
    ("required", "<|channel|>analysis<|message|>a<|end|>b<|end|><|start|>assistant" + NOW,
     False),  # the reasoning's text holds no end of a body
])
def test_the_call_tokens_a_model_writes_are_what_the_grammar_allows(
        harmony_tokenizer, choice, text, accepted):
    ids = harmony_tokenizer.encode(text)
    assert set(ids) & {harmony_tokenizer.encode(m)[0] for m in SPECIAL_MARKERS}
    allowed, complete = walk(special_constraint(choice), harmony_tokenizer, ids)
    assert (allowed == len(ids) and complete) is accepted
    if accepted:  # the text of those tokens reads back as reasoning and one call
        written = harmony_tokenizer.decode(ids[:-1] if ids[-1] in
                                           harmony_tokenizer.stop_token_ids else ids)
        reasoning, answer = split_whole(HarmonySplitter(), written)
        content, calls = parse_tool_calls(answer, format_named("harmony"), SCHEMAS)
        assert content == "" and len(calls) == 1
        assert reasoning == ("Need the <|end tool." if "analysis" in text else "")
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])


def test_the_special_form_has_one_call_per_reply(harmony_tokenizer):
    """<|call|> is a stop token: the reply ends at the first call, so the special form's
    grammar has no calls after it, parallel or not; the text form (the control) repeats
    calls under parallel."""
    harmony = format_named("harmony")
    one = constraint_grammar(harmony, FUNCTIONS, "required", False, True)
    assert constraint_grammar(harmony, FUNCTIONS, "required", True, True) == one
    assert "<|call|> <|start|>" not in one
    assert constraint_grammar(harmony, FUNCTIONS, "required", True) != \
        constraint_grammar(harmony, FUNCTIONS, "required", False)
    first = harmony_tokenizer.encode(CALL + "<|call|>")
    ids = harmony_tokenizer.encode(CALL + "<|call|><|start|>assistant" + NOW + "<|call|>")
    assert first[-1] in harmony_tokenizer.stop_token_ids
    assert walk(special_constraint("required", parallel=True), harmony_tokenizer, ids) == \
        (len(first), True)


def test_negative_control_the_text_form_refuses_the_marker_tokens(harmony_tokenizer,
                                                                  tiny_checkpoints):
    text_form = Constraint.grammar(constraint_grammar(format_named("harmony"), FUNCTIONS,
                                                      "get_weather", False))
    assert text_form.special_tokens == ()
    # The markers as text: the forced "<|channel|>" is written in characters, never as the
    # special token, so the marker ids a model writes for a call are refused at once ...
    markers = {harmony_tokenizer.encode(marker)[0] for marker in SPECIAL_MARKERS}
    forced = text_form.matcher(harmony_tokenizer, harmony_tokenizer.vocab_size,
                               harmony_tokenizer.stop_token_ids).forced()
    assert harmony_tokenizer.decode(forced) == "<|channel|>" and len(forced) == 11
    assert not set(forced) & markers
    ids = harmony_tokenizer.encode(CALL + "<|call|>")
    assert walk(text_form, harmony_tokenizer, ids) == (0, False)
    # ... where the special form takes them all.
    special = special_constraint("get_weather")
    special.compile_for(harmony_tokenizer)
    assert walk(special, harmony_tokenizer, ids) == (len(ids), True)
    # The special form needs the markers as special tokens: refused, naming them, for the
    # tiny llama's tokenizer, where the text form is the one that works.
    plain = Tokenizer.from_folder(tiny_checkpoints["llama"])
    with pytest.raises(ConstraintError, match="<\\|call\\|>, <\\|channel\\|>.*which this"):
        special.compile_for(plain)
    text_form.compile_for(plain)


@pytest.fixture(scope="module")
def served(harmony_folder):
    generator = xd.Generator.from_pretrained(harmony_folder, "torch",
                                             chat_template=chat_template_source("harmony"),
                                             progress=False)
    with server_in_thread(generator, "tiny", max_sequences=4, max_waiting=16) as (base, _):
        yield base, generator.tokenizer


def forced_call(reply: dict) -> dict:
    """The one call of a chat completion that made it, its arguments checked."""
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    [call] = choice["message"]["tool_calls"]
    name, arguments = call["function"]["name"], call["function"]["arguments"]
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    assert choice["message"]["content"] is None and choice["message"]["reasoning_content"] \
        is None
    return call["function"]


def without_ids(blocks: list[dict]) -> list[dict]:
    return [{k: v for k, v in block.items() if k != "id"} for block in blocks]


def anthropic_streamed(base: str, body: dict) -> list[dict]:
    """The content blocks a streamed /v1/messages builds, a tool_use block's input from its
    input_json_delta events, ids left out (each reply has its own)."""
    blocks, stops = streamed_blocks(base, body)
    assert stops == list(range(len(blocks)))
    inputs: dict[int, str] = {}
    for name, payload in stream(base, "/v1/messages", body):
        if name == "content_block_delta" and payload["delta"]["type"] == "input_json_delta":
            inputs[payload["index"]] = inputs.get(payload["index"], "") + \
                payload["delta"]["partial_json"]
    for index, text in inputs.items():
        blocks[index]["input"] = json.loads(text)
    return without_ids(blocks)


@pytest.mark.parametrize("tool_choice", [
    {"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_a_forced_call_through_the_server_is_a_parsed_call(served, tool_choice):
    base, tokenizer = served
    # Kept from "analysis" after <|channel|> (the tiny model would reason to the length limit).
    banned = {str(tokenizer.encode("a")[0]): -100}
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 120,
            "temperature": 1.0, "logit_bias": banned}
    names = set()
    for seed in range(3):
        status, reply = post(base, "/v1/chat/completions", {**body, "seed": seed})
        assert status == 200, reply
        call = forced_call(reply)
        names.add(call["name"])
        deltas = [payload["choices"][0]["delta"] for _, payload in
                  stream(base, "/v1/chat/completions", {**body, "seed": seed})
                  if payload["choices"]]
        streamed = [entry for delta in deltas for entry in delta.get("tool_calls", [])]
        assert streamed[0]["function"]["name"] == call["name"]
        assert "".join(c["function"]["arguments"] for c in streamed) == call["arguments"]
        assert "".join(d.get("content") or "" for d in deltas) == ""
    assert names <= ({"get_weather"} if isinstance(tool_choice, dict) else set(SCHEMAS))
    # Anthropic's forced tool (no logit_bias there: the model reasons first, to <|end|> or to
    # the length limit): a tool_use block, streamed as whole.
    anthropic = {"messages": ASK, "max_tokens": 600, "temperature": 1.0,
                 "tool_choice": {"type": "tool", "name": "get_weather"} if
                 isinstance(tool_choice, dict) else {"type": "any"},
                 "tools": [{"name": f["name"], "input_schema": f["parameters"]}
                           for f in FUNCTIONS]}
    used = []
    for seed in range(8):
        status, message = post(base, "/v1/messages", {**anthropic, "seed": seed})
        assert status == 200, message
        assert anthropic_streamed(base, {**anthropic, "seed": seed}) == \
            without_ids(message["content"])
        if message["stop_reason"] == "max_tokens":
            assert [b["type"] for b in message["content"]] == ["thinking"]
            continue
        assert message["stop_reason"] == "tool_use", message
        *thoughts, block = message["content"]  # reasoning first, ended by <|end|>, or none
        assert [b["type"] for b in thoughts] in ([], ["thinking"]) and block["type"] == \
            "tool_use"
        assert not any(marker in b["thinking"] for b in thoughts for marker in
                       ("<|end|>", "<|start|>", "<|channel|>"))
        jsonschema.validate(block["input"], SCHEMAS[block["name"]])
        used.append(block["name"])
    assert used and set(used) <= ({"get_weather"} if isinstance(tool_choice, dict)
                                  else set(SCHEMAS))


def test_negative_control_the_server_with_the_text_form_spells_the_markers(served,
                                                                          monkeypatch):
    """The text form on this tokenizer is served, but writes the markers in characters (never
    as a model with these special tokens writes them), where the special form writes their
    ids."""
    base, tokenizer = served
    markers = {tokenizer.encode(marker)[0] for marker in SPECIAL_MARKERS}
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 40,
            "logprobs": True, "seed": 1}

    def written() -> tuple[str, set[int]]:
        status, reply = post(base, "/v1/chat/completions", body)
        assert status == 200, reply
        ids = [entry["token_id"] for entry in reply["choices"][0]["logprobs"]["content"]]
        if ids[-1] in tokenizer.stop_token_ids:  # <|call|>, a marker, may be the stop token
            ids.pop()
        return tokenizer.decode(ids), set(ids)

    text, ids = written()
    assert text.startswith("<|channel|>") and ids & markers
    monkeypatch.setattr(requests, "markers_are_special", lambda tokenizer: False)
    text, ids = written()
    assert text.startswith("<|channel|>") and not ids & markers


class CountedBackend:
    def __init__(self, markers) -> None:
        from tokenizers import AddedToken

        self.added = {i: AddedToken(m, special=True) for i, m in enumerate(markers)}
        self.reads = 0

    def get_added_tokens_decoder(self):
        self.reads += 1
        return self.added


class StandIn:
    def __init__(self, backend) -> None:
        self.backend = backend


def test_markers_are_special_reads_the_added_tokens_once_per_tokenizer():
    from exactdraft.server.tool_calls.harmony import SPECIAL_MARKERS, markers_are_special

    harmony, plain = StandIn(CountedBackend(SPECIAL_MARKERS)), StandIn(CountedBackend([]))
    for _ in range(3):
        assert markers_are_special(harmony) and not markers_are_special(plain)
    assert harmony.backend.reads == 1 and plain.backend.reads == 1
