"""The `constraint` field's special_tokens (exactdraft/server/special_tokens.py): a grammar that
names special tokens, declared in the request, is generated through every API that takes
`constraint` (chat completions, completions, Anthropic messages) on the tiny llama with a
tokenizer that has Harmony's markers as special tokens, the named token written as its id; each
bad value is refused with a 400 naming its field (`constraint.special_tokens`,
`constraint.special_tokens[i]`), a token the tokenizer lacks as a special token is refused
naming it, special_tokens with a kind that names none is refused by name, a grammar that refers
to a token by id (`<[1]>`) is refused naming constraint.grammar, and the server goes on
serving. Negative controls: the same grammar undeclared is refused, and without the named
token the reply holds no special id. A JSON const equal to a marker's text is served as text."""

from __future__ import annotations

import pytest

from exactdraft.server.fields import ConstraintRequest, RequestError, constraint_from
from exactdraft.server.tool_calls.harmony import SPECIAL_MARKERS
from tests.server.live import post
from tests.server.tool_calls import test_harmony_special_tokens as harmony

pytest.importorskip("llguidance")

# The tiny llama with Harmony's markers as special tokens, and a server of it.
harmony_folder, harmony_tokenizer, served = \
    harmony.harmony_folder, harmony.harmony_tokenizer, harmony.served

GRAMMAR = 'start: "x" <|channel|> "y"'
DECLARED = {"grammar": GRAMMAR, "special_tokens": ["<|channel|>"]}
ASK = [{"role": "user", "content": "Hi"}]


def test_the_field_carries_the_declared_tokens_in_the_request_order():
    body = {"constraint": {"special_tokens": ["<|message|>", "<|channel|>", "<|message|>"],
                           "gbnf": GRAMMAR}}
    request = constraint_from(body)
    assert request == ConstraintRequest(
        "constraint.gbnf", "gbnf", GRAMMAR,
        special_tokens=("<|message|>", "<|channel|>", "<|message|>"),
        special_tokens_field="constraint.special_tokens")
    # The control: without the key, nothing is declared and nothing checked by that field.
    plain = constraint_from({"constraint": {"grammar": GRAMMAR}})
    assert plain.special_tokens == () and plain.special_tokens_field == ""
    for nothing in ([], None):  # declares nothing, as no key does (null: as if absent)
        assert constraint_from({"constraint": {**DECLARED, "special_tokens": nothing}}) == plain
    for nothing in ([], None):  # with a kind that names no special tokens too
        for other in ({"regex": "x"}, {"json_schema": {"type": "string"}}, {"choices": ["a"]}):
            request = constraint_from({"constraint": {**other, "special_tokens": nothing}})
            assert request == constraint_from({"constraint": other})


@pytest.mark.parametrize("constraint, param, words", [
    ({"grammar": GRAMMAR, "special_tokens": "<|channel|>"}, "constraint.special_tokens",
     "must be a list"),
    ({"grammar": GRAMMAR, "special_tokens": {"0": "<|channel|>"}},
     "constraint.special_tokens", "must be a list"),
    ({"grammar": GRAMMAR, "special_tokens": ["<|channel|>", 7]},
     "constraint.special_tokens[1]", "got 7"),
    ({"grammar": GRAMMAR, "special_tokens": ["channel"]}, "constraint.special_tokens[0]",
     "'channel'"),
    ({"grammar": GRAMMAR, "special_tokens": ["<|a b|>"]}, "constraint.special_tokens[0]",
     "no whitespace"),
    ({"regex": "x", "special_tokens": ["<|channel|>"]}, "constraint.special_tokens",
     "a regex constraint names no special tokens"),
    ({"json_schema": {"type": "string"}, "special_tokens": ["<|channel|>"]},
     "constraint.special_tokens", "json_schema"),
    ({"choices": ["a"], "special_tokens": ["<|channel|>"]}, "constraint.special_tokens",
     "goes with grammar or gbnf"),
    ({"special_tokens": ["<|channel|>"]}, "constraint", "one of the keys"),
    ({"grammar": GRAMMAR, "regex": "x", "special_tokens": []}, "constraint",
     "one of the keys"),
])
def test_bad_values_are_refused_by_field(constraint, param, words):
    with pytest.raises(RequestError) as refusal:
        constraint_from({"constraint": constraint})
    assert refusal.value.param == param and refusal.value.status == 400
    assert words in str(refusal.value)


def test_a_token_the_tokenizer_lacks_is_refused_naming_it(harmony_tokenizer):
    request = constraint_from({"constraint": {
        "grammar": 'start: "x" <|channel|> <|im_end|>',
        "special_tokens": ["<|channel|>", "<|im_end|>"]}})
    with pytest.raises(RequestError, match="special token <\\|im_end\\|>") as refusal:
        request.build(harmony_tokenizer)
    assert refusal.value.param == "constraint.special_tokens[1]"
    # The control: every declared token is special there, and the constraint is built.
    built = constraint_from({"constraint": DECLARED}).build(harmony_tokenizer)
    assert built.special_tokens == ("<|channel|>",)


def reply_ids(reply: dict) -> list[int]:
    return [entry["token_id"] for entry in reply["choices"][0]["logprobs"]["content"]]


def test_a_declared_grammar_through_every_api(served):
    base, tokenizer = served
    x, channel, y = (tokenizer.backend.token_to_id(piece) for piece in ("x", "<|channel|>",
                                                                         "y"))
    common = {"max_tokens": 8, "temperature": 1.0, "seed": 2, "constraint": DECLARED}
    status, chat = post(base, "/v1/chat/completions", {**common, "messages": ASK,
                                                       "logprobs": True})
    assert status == 200, chat
    *written, stop = reply_ids(chat)  # the grammar's end lets the stop tokens in: one ends it
    assert written == [x, channel, y] and stop in tokenizer.stop_token_ids
    status, completion = post(base, "/v1/completions", {**common, "prompt": "Hi",
                                                        "logprobs": 0})
    assert status == 200, completion
    assert completion["choices"][0]["text"] == "x<|channel|>y"
    assert completion["choices"][0]["finish_reason"] == "stop"
    status, message = post(base, "/v1/messages", {**common, "messages": ASK})
    assert status == 200, message
    assert message["stop_reason"] == "end_turn"
    # The control: written as text, the marker comes out in characters, never as the id.
    status, text = post(base, "/v1/chat/completions", {
        **common, "messages": ASK, "logprobs": True, "max_tokens": 20,
        "constraint": {"grammar": 'start: "x<|channel|>y"'}})
    assert status == 200, text
    *written, stop = reply_ids(text)
    assert written == [tokenizer.backend.token_to_id(c) for c in "x<|channel|>y"]
    assert stop in tokenizer.stop_token_ids and channel not in written


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/messages"])
@pytest.mark.parametrize("constraint, param, words", [
    ({"grammar": GRAMMAR}, "constraint.grammar",  # named, not declared
     "declares them: constraint.special_tokens, a list beside the grammar"),
    ({**DECLARED, "special_tokens": ["<|channel|>", "<|im_end|>"]},
     "constraint.special_tokens[1]", "<|im_end|>"),
    ({**DECLARED, "special_tokens": ["<|channel|>", ["<|x|>"]]},
     "constraint.special_tokens[1]", "special token's name"),
    ({"regex": "x", "special_tokens": ["<|channel|>"]}, "constraint.special_tokens", "regex"),
    ({"grammar": 'start: "x" <[1]> "y"'}, "constraint.grammar",  # a token by id
     "refers to tokens by id (<[1]>); name each special token instead (<|channel|>) and "
     "declare it: constraint.special_tokens, a list beside the grammar"),
])
def test_refusals_name_the_field_and_the_server_goes_on(served, path, constraint, param,
                                                        words):
    base, _ = served
    body = {"max_tokens": 8, "constraint": constraint}
    body.update({"prompt": "Hi"} if path == "/v1/completions" else {"messages": ASK})
    status, reply = post(base, path, body)
    assert status == 400, reply
    assert reply["error"]["param"] == param and words in reply["error"]["message"], reply
    status, reply = post(base, path, {**body, "constraint": DECLARED})
    assert status == 200, reply


def test_a_const_equal_to_a_marker_is_served_as_text(served):
    base, tokenizer = served
    markers = {tokenizer.backend.token_to_id(marker) for marker in SPECIAL_MARKERS}
    status, reply = post(base, "/v1/chat/completions", {
        "messages": ASK, "max_tokens": 20, "logprobs": True,
        "constraint": {"json_schema": {"const": "<|channel|>"}}})
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"] == '"<|channel|>"'
    *written, stop = reply_ids(reply)  # any stop token may end it, <|call|> among them
    assert stop in tokenizer.stop_token_ids and not set(written) & markers
    assert len(written) == len('"<|channel|>"')  # one character each
