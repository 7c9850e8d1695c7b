"""Reasoning tokens: the count on hand-made vocabularies (a token straddling the reasoning's edge
counts once, as reasoning; bytes of one character go with it; adjacent Harmony messages share
no token twice) and through the live server on the tiny llama (one token a character), where
the count is the number of tokens the tokenizer gives for the reasoning and its markup, the
same in the whole and the streamed reply of the chat and Responses APIs, and 0 without
reasoning. The token offsets are found in one pass equal to every prefix decoded whole, and a
stream counts only when its usage is sent."""

from __future__ import annotations

import re

import pytest

from exactdraft.server.reasoning.formats import ThinkSplitter
from exactdraft.server.reasoning.harmony import HarmonySplitter
from exactdraft.server.reasoning.usage import (
    prefix_offsets,
    reasoning_token_count,
    text_offsets,
)
from tests.conftest import needs_smollm2
from tests.server.live import post
from tests.server.reasoning.test_replies import ASK, OPENED, SHAPE, THINK, stream, think_server

pytest.importorskip("llguidance")


def count(make, pieces: list[str | bytes]) -> int:
    """The reasoning tokens of a reply made of `pieces` (one a token: its text, or its bytes),
    split by the splitter `make` gives."""
    def decode(ids: list[int]) -> str:
        return b"".join(p if isinstance(p, bytes) else p.encode() for p in
                        (pieces[i] for i in ids)).decode("utf-8", "replace")

    splitter = make()
    splitter.feed(decode(list(range(len(pieces)))))
    splitter.finish()
    return reasoning_token_count(splitter.spans, range(len(pieces)), decode)


def closed() -> ThinkSplitter:
    return ThinkSplitter(False)


@pytest.mark.parametrize("make, pieces, expected", [
    (closed, ["<think>", "a", "b", "</think>", "\n\n", "Hi"], 4),
    # The token holding "</" and the one holding "think>\n\n" straddle nothing but the edge:
    # each counts once, as reasoning.
    (closed, ["<think>", "ab</", "think>\n\n", "Hi"], 3),
    (closed, ["<think>ab</think>\n\nHi"], 1),
    (closed, ["\n", "<think>", "a", "</think>", "Hi"], 3),  # the whitespace before is not
    (closed, ["Hi", " there"], 0),  # no reasoning written
    (closed, ["Hi <think>", "a", "</think>"], 0),  # <think> not opening the reply
    (closed, ["<think>", "cut by", " the limit"], 3),  # all reasoning
    (lambda: ThinkSplitter(True), ["a", "b", "</think>", "Hi"], 3),  # opened by the prompt
    # "é" in two byte tokens: at the end of the reasoning both count; after </think> the
    # first byte has no text of its own and stands at the edge, with the answer.
    (closed, ["<think>", b"\xc3", b"\xa9", "</think>", "x"], 4),
    (closed, ["<think>", "a", "</think>", b"\xc3", b"\xa9"], 3),
    (HarmonySplitter, ["<|channel|>", "analysis", "<|message|>", "Need", " it.", "<|end|>",
                       "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "Yes",
                       "<|return|>"], 6),
    # Two analysis messages and a token across their shared edge: counted once.
    (HarmonySplitter, ["<|channel|>analysis<|message|>a", "<|end|><|start|>assistant",
                       "<|channel|>analysis<|message|>b<|end|>", "<|start|>assistant",
                       "<|channel|>final<|message|>c"], 3),
    # Reasoning, a commentary message, reasoning: the commentary's own tokens do not count.
    (HarmonySplitter, ["<|channel|>analysis<|message|>a<|end|>",
                       "<|start|>assistant<|channel|>commentary<|message|>", "say", "<|end|>",
                       "<|start|>assistant<|channel|>analysis<|message|>b<|end|>", "x"], 2),
])
def test_the_count_on_made_vocabularies(make, pieces, expected):
    assert count(make, pieces) == expected


def test_a_count_that_would_differ_is_seen():
    """Negative control: summing each span's tokens apart counts the token across two
    adjacent spans twice; the function counts it once."""
    pieces = ["<|channel|>analysis<|message|>a", "<|end|><|start|>assistant",
              "<|channel|>analysis<|message|>b<|end|>", "x"]
    splitter = HarmonySplitter()
    text = "".join(pieces)
    splitter.feed(text)
    splitter.finish()
    end = len("<|channel|>analysis<|message|>a<|end|>")
    assert splitter.spans == [[0, end], [end, len(text) - 1]]
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    apart = sum(reasoning_token_count([span], range(len(pieces)), decode)
                for span in splitter.spans)
    assert apart == 4 and reasoning_token_count(splitter.spans, range(len(pieces)), decode) == 3


@pytest.fixture(scope="module")
def served(tiny_checkpoints):
    with think_server(tiny_checkpoints["llama"]) as served:
        yield served


BODY = {"messages": ASK, "max_tokens": 40, "temperature": 1.0,
        "constraint": {"regex": SHAPE}}


def reasoning_region(tokenizer, text: str) -> int:
    """The tokens the tokenizer gives for the reasoning of a text written as SHAPE, its
    markup included."""
    region = re.match(r"<think>.*?</think>", text, re.S).group(0)
    return len(tokenizer.encode(region, add_special_tokens=False))


@pytest.mark.parametrize("seed", [1, 5])
def test_chat_counts_the_reasoning_tokens_whole_and_streamed(served, seed):
    base, tokenizer = served
    status, written = post(base, "/v1/chat/completions",
                           {**BODY, "seed": seed, "separate_reasoning": False})
    assert status == 200, written
    raw = written["choices"][0]["message"]["content"]
    expected = reasoning_region(tokenizer, raw)
    assert 0 < expected < written["usage"]["completion_tokens"]
    # With the reasoning kept in the text the tokens are still reasoning tokens.
    assert written["usage"]["completion_tokens_details"] == {"reasoning_tokens": expected}
    status, split = post(base, "/v1/chat/completions", {**BODY, "seed": seed})
    assert status == 200, split
    assert split["usage"]["completion_tokens_details"]["reasoning_tokens"] == expected
    chunks = [payload for _, payload in stream(base, "/v1/chat/completions", {
        **BODY, "seed": seed, "stream_options": {"include_usage": True}})]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert (usage["completion_tokens"], usage["completion_tokens_details"]) == \
        (split["usage"]["completion_tokens"], split["usage"]["completion_tokens_details"])
    # Two choices: the counts add up.
    status, both = post(base, "/v1/chat/completions", {**BODY, "seed": seed, "n": 2,
                                                       "separate_reasoning": False})
    assert status == 200, both
    assert both["usage"]["completion_tokens_details"]["reasoning_tokens"] == sum(
        reasoning_region(tokenizer, c["message"]["content"]) for c in both["choices"])


def test_responses_counts_the_reasoning_tokens_whole_and_streamed(served):
    base, tokenizer = served
    body = {"input": "Hi", "max_output_tokens": 30, "temperature": 1.0, "seed": 2}
    tokenizer.use_chat_template(OPENED)  # the reply starts inside <think>
    try:
        status, written = post(base, "/v1/responses", {**body, "separate_reasoning": False})
        assert status == 200, written
        status, response = post(base, "/v1/responses", body)
        assert status == 200, response
        events = [payload for _, payload in stream(base, "/v1/responses", body)]
    finally:
        tokenizer.use_chat_template(THINK)
    raw = written["output"][0]["content"][0]["text"]
    closing = raw.find("</think>")
    region = raw if closing < 0 else raw[:closing + len("</think>")]
    expected = len(tokenizer.encode(region, add_special_tokens=False))
    assert expected > 0
    assert written["usage"]["output_tokens_details"] == {"reasoning_tokens": expected}
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": expected}
    streamed = events[-1]["response"]["usage"]
    assert (streamed["output_tokens"], streamed["output_tokens_details"]) == \
        (response["usage"]["output_tokens"], response["usage"]["output_tokens_details"])
    # The control: the same request where the reply does not start inside <think> (the
    # tiny model writes no <think> of its own) counts none.
    status, plain = post(base, "/v1/responses", body)
    assert status == 200, plain
    assert [item["type"] for item in plain["output"]] == ["message"]
    assert plain["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}


def test_no_reasoning_counts_nothing(served, live):
    base, _ = served
    # The template has reasoning, the model writes none.
    status, reply = post(base, "/v1/chat/completions", {
        **BODY, "seed": 1, "constraint": {"regex": "[a-z ]{1,12}"}})
    assert status == 200, reply
    assert reply["choices"][0]["message"]["reasoning_content"] is None
    assert reply["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    # A template without reasoning: the <think> the model writes is text, not reasoning.
    url, _ = live
    status, reply = post(url, "/v1/chat/completions", {**BODY, "seed": 1})
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"].startswith("<think>")
    assert reply["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    status, response = post(url, "/v1/responses", {"input": "Hi", "max_output_tokens": 8})
    assert status == 200, response
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}


@needs_smollm2
def test_the_count_with_a_subword_tokenizer():
    """The bundled SmolLM2's byte-level BPE, where one token (">.") holds the end of
    </think> and the start of the answer: the count is the number of tokens its tokenizer
    gives for the reasoning and its markup, the straddling token counted once, as reasoning."""
    from exactdraft.pretrained import load_checkpoint

    tokenizer = load_checkpoint(None).tokenizer
    region = "<think>\nThe user greets me; I greet back, café and all.\n</think>"
    text = region + ". Hello! Nice to meet you."
    ids = tokenizer.encode(text, add_special_tokens=False)
    ends = [len(tokenizer.decode(ids[:k + 1])) for k in range(len(ids))]
    assert any(start < len(region) < end for start, end in zip([0, *ends], ends))  # the case
    splitter = ThinkSplitter(False)
    splitter.feed(text)
    splitter.finish()
    expected = len(tokenizer.encode(region, add_special_tokens=False))
    assert 0 < expected < len(ids)
    assert reasoning_token_count(splitter.spans, ids, tokenizer.decode) == expected


def made_decode(pieces: list[str | bytes], decoded: list[int] | None = None):
    """A decoder of `pieces` (one a token) that adds to `decoded` the tokens it decodes."""
    def decode(ids: list[int]) -> str:
        if decoded is not None:
            decoded.append(len(ids))
        return b"".join(p if isinstance(p, bytes) else p.encode() for p in
                        (pieces[i] for i in ids)).decode("utf-8", "replace")
    return decode


def test_the_offsets_are_the_prefix_decodes_in_one_pass():
    """Harmony-shaped text of 40 analysis messages (tokens of text, markers, and "é" and "€"
    cut into bytes): the one-pass offsets equal every prefix decoded whole, and the decoder is
    asked for a number of tokens linear in the reply (the prefixes decoded whole, the control,
    ask for a quadratic number)."""
    pieces: list[str | bytes] = []
    for message in range(40):
        pieces += ["<|channel|>", "analysis", "<|message|>", "Step", f" {message}", " caf",
                   b"\xc3", b"\xa9", " costs", " ", b"\xe2", b"\x82", b"\xac", "3", ".",
                   "<|end|>", "<|start|>", "assistant"]
    pieces += ["<|channel|>", "final", "<|message|>", "Done", "<|return|>"]
    tokens = list(range(len(pieces)))
    fast, whole = [], []
    offsets = text_offsets(tokens, made_decode(pieces, fast))
    assert offsets == prefix_offsets(tokens, made_decode(pieces, whole))
    assert sum(fast) <= 12 * len(tokens) and sum(whole) > 25 * sum(fast)
    # Byte tokens hold their offset back until the character is whole.
    cafe = pieces.index(" caf")
    assert offsets[cafe + 2] == offsets[cafe + 1] and offsets[cafe + 3] == offsets[cafe + 1] + 1


def test_a_decoder_whose_text_is_not_local_gets_the_prefix_decodes():
    """A decoder that writes the count of tokens first: the windows cannot give its offsets,
    the whole text's length says so, and every prefix is decoded instead."""
    def decode(ids: list[int]) -> str:
        return f"{len(ids)}:" + "".join("ab"[i % 2] for i in ids)

    tokens = list(range(12))
    assert text_offsets(tokens, decode) == prefix_offsets(tokens, decode)
    assert text_offsets(tokens, decode)[-1] == len("12:" + "ab" * 6)


@needs_smollm2
def test_the_offsets_on_a_subword_tokenizer():
    from exactdraft.pretrained import load_checkpoint

    tokenizer = load_checkpoint(None).tokenizer
    text = ("<think>\nThe user greets me; I greet back, café and all, 3€ — ✓ 你好.\n</think>"
            "  Hello!\n\n  Nice to meet you. 🙂") * 3
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert text_offsets(ids, tokenizer.decode) == prefix_offsets(ids, tokenizer.decode)


def test_the_count_is_made_only_for_a_usage_that_is_sent(served, monkeypatch):
    """A streamed chat reply counts its reasoning tokens only with include_usage; a whole
    reply, whose usage is always sent, counts them."""
    import exactdraft.server.openai_api as openai_api

    counted: list[int] = []
    make_counter = openai_api.reasoning_counter

    def counting(tokenizer, prompt_ids):
        count = make_counter(tokenizer, prompt_ids)

        def counted_count(text, tokens):
            counted.append(len(tokens))
            return count(text, tokens)
        return counted_count

    monkeypatch.setattr(openai_api, "reasoning_counter", counting)
    base, _ = served
    body = {**BODY, "seed": 1}
    stream(base, "/v1/chat/completions", {**body, "stream": True})
    assert counted == []
    stream(base, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    assert len(counted) == 1
    status, reply = post(base, "/v1/chat/completions", body)
    assert status == 200 and len(counted) == 2, reply
