"""Reasoning through the live server on the tiny llama, its chat template one that has
reasoning: the split never changes the tokens (the same seed with `separate_reasoning: false`,
the text as it was written, gives the same receipt, and the markup put back around the
reasoning and the answer is that text), streamed == whole in each API, reasoning given back in
a request reaches the template (or is dropped where the template drops it), a template without
reasoning answers as before, and a Harmony forced tool call is constrained."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.request
from collections.abc import Iterator

import pytest

import exactdraft as xd
from exactdraft.loading.builtin_templates import chat_template_source
from exactdraft.server.reasoning.signatures import sign
from tests.server.live import post, server_in_thread

pytest.importorskip("llguidance")

# A ChatML-like template that renders past reasoning as Qwen3's does; OPENED starts the
# reply inside <think>, as DeepSeek-R1's does.
THINK = ("{% for m in messages %}<{{ m.role }}>{% if m.role == 'assistant' and "
         "m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
         "{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
OPENED = THINK.replace("<assistant>{% endif %}", "<assistant><think>{% endif %}")
SHAPE = r"<think>[a-z ]{1,12}</think>\n[a-z ]{1,12}"  # what the constraint makes the model write
ASK = [{"role": "user", "content": "Hi"}]
KEY = b"the thinking key of the test server"


@contextlib.contextmanager
def think_server(folder: str) -> Iterator[tuple[str, object]]:
    """(url, tokenizer) of a server of the tiny llama in `folder` under the think template,
    its thinking blocks signed with KEY."""
    generator = xd.Generator.from_pretrained(folder, "torch", chat_template=THINK,
                                             progress=False)
    with server_in_thread(generator, "tiny", max_sequences=4, max_waiting=16,
                          thinking_key=KEY) as (base, _):
        yield base, generator.tokenizer


@pytest.fixture(scope="module")
def served(tiny_checkpoints):
    with think_server(tiny_checkpoints["llama"]) as served:
        yield served


@pytest.fixture
def base(served):
    """The server's url, its template the think template for the test."""
    url, tokenizer = served
    tokenizer.use_chat_template(THINK)
    return url


def stream(base: str, path: str, body: dict) -> list[tuple[str | None, dict]]:
    """(event name, payload) of each server-sent event of a streamed POST."""
    request = urllib.request.Request(base + path, data=json.dumps({**body, "stream": True})
                                     .encode(), method="POST",
                                     headers={"content-type": "application/json"})
    events, name = [], None
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: ") and line != "data: [DONE]":
                events.append((name, json.loads(line[len("data: "):])))
                name = None
    return events


def streamed_blocks(base: str, body: dict) -> tuple[list[dict], list[int]]:
    """(the content blocks a streamed /v1/messages builds, its text and thinking deltas
    joined and signatures set; the indexes its content_block_stop events close, in order)."""
    blocks: dict[int, dict] = {}
    stops = []
    for name, payload in stream(base, "/v1/messages", body):
        if name == "content_block_start":
            blocks[payload["index"]] = dict(payload["content_block"])
        elif name == "content_block_delta" and payload["delta"]["type"] != "input_json_delta":
            delta = payload["delta"]
            if delta["type"] == "signature_delta":  # the thinking block's, as it ends
                blocks[payload["index"]]["signature"] = delta["signature"]
                continue
            key = "thinking" if delta["type"] == "thinking_delta" else "text"
            blocks[payload["index"]][key] += delta[key]
        elif name == "content_block_stop":
            stops.append(payload["index"])
    return [blocks[i] for i in sorted(blocks)], stops


def chat(base: str, seed: int = 5, **extra) -> dict:
    status, reply = post(base, "/v1/chat/completions", {
        "messages": ASK, "max_tokens": 40, "temperature": 1.0, "seed": seed,
        "constraint": {"regex": SHAPE}, **extra})
    assert status == 200, reply
    return reply["choices"][0]


def test_chat_reasoning_is_apart_and_the_tokens_are_the_same(base):
    written = chat(base, separate_reasoning=False)
    split = chat(base)
    raw = written["message"]["content"]
    assert "reasoning_content" not in written["message"]
    match = re.fullmatch(r"<think>(.*)</think>\s*(.*)", raw, re.S)
    assert split["message"]["reasoning_content"] == match.group(1)
    assert split["message"]["content"] == match.group(2)
    assert split["receipt"]["token_ids_sha256"] == written["receipt"]["token_ids_sha256"]
    # Negative controls: another seed writes other tokens (the receipt check can fail), and
    # the split moved the markup out of the content.
    assert chat(base, seed=6)["receipt"]["token_ids_sha256"] != \
        written["receipt"]["token_ids_sha256"]
    assert "<think>" in raw and "<think>" not in split["message"]["content"]
    chunks = [payload for _, payload in stream(base, "/v1/chat/completions", {
        "messages": ASK, "max_tokens": 40, "temperature": 1.0, "seed": 5,
        "constraint": {"regex": SHAPE}})]
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == \
        split["message"]["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == split["message"]["content"]
    assert chunks[-1]["choices"][0]["receipt"]["token_ids_sha256"] == \
        split["receipt"]["token_ids_sha256"]


def test_anthropic_thinking_block_streamed_and_whole(base):
    body = {"messages": ASK, "max_tokens": 40, "temperature": 1.0, "seed": 5,
            "constraint": {"regex": SHAPE}}
    status, written = post(base, "/v1/messages", {**body, "separate_reasoning": False})
    assert status == 200, written
    status, message = post(base, "/v1/messages", body)
    assert status == 200, message
    raw = written["content"][0]["text"]
    match = re.fullmatch(r"<think>(.*)</think>\s*(.*)", raw, re.S)
    assert message["content"] == [
        {"type": "thinking", "thinking": match.group(1), "signature": sign(KEY, match.group(1))},
        {"type": "text", "text": match.group(2)}]
    assert message["receipt"]["token_ids_sha256"] == written["receipt"]["token_ids_sha256"]
    blocks, stops = streamed_blocks(base, body)
    assert blocks == message["content"]
    assert stops == [0, 1]


def test_responses_reasoning_item_streamed_and_whole(base, served):
    served[1].use_chat_template(OPENED)  # the reply starts inside <think>: all reasoning
    body = {"input": "Hi", "max_output_tokens": 30, "temperature": 1.0, "seed": 2}
    status, written = post(base, "/v1/responses", {**body, "separate_reasoning": False})
    assert status == 200, written
    status, response = post(base, "/v1/responses", body)
    assert status == 200, response
    raw = written["output"][0]["content"][0]["text"]
    assert "</think>" not in raw  # (the tiny model does not close it)
    assert [item["type"] for item in written["output"]] == ["message"]
    assert [item["type"] for item in response["output"]] == ["reasoning"]
    assert response["output"][0]["content"] == [{"type": "reasoning_text", "text": raw}]
    assert response["receipt"] == written["receipt"]
    events = [payload for _, payload in stream(base, "/v1/responses", body)]
    text = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert text == raw
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [without_id(item) for item in done] == [without_id(item) for item in
                                                   response["output"]]
    assert events[-1]["response"]["output"] == done


def without_id(item: dict) -> dict:
    return {key: value for key, value in item.items() if key != "id"}


def prompt_tokens(base: str, path: str, body: dict) -> int:
    status, reply = post(base, path, {**body, "max_tokens": 1, "max_output_tokens": 1}
                         if path == "/v1/responses" else {**body, "max_tokens": 1})
    assert status == 200, reply
    usage = reply["usage"]  # Anthropic's input_tokens leave out the prefix cache's
    return usage.get("prompt_tokens", usage.get("input_tokens")) + \
        usage.get("cache_read_input_tokens", 0)


GIVEN = "a thought"


@pytest.mark.parametrize("path, with_reasoning, without", [
    ("/v1/chat/completions",
     {"messages": [*ASK, {"role": "assistant", "content": "Yo", "reasoning_content": GIVEN},
                   *ASK]},
     {"messages": [*ASK, {"role": "assistant", "content": "Yo"}, *ASK]}),
    ("/v1/messages",
     {"messages": [*ASK, {"role": "assistant", "content": [
         {"type": "thinking", "thinking": GIVEN, "signature": sign(KEY, GIVEN)},
         {"type": "redacted_thinking", "data": "y"}, {"type": "text", "text": "Yo"}]}, *ASK]},
     {"messages": [*ASK, {"role": "assistant", "content": "Yo"}, *ASK]}),
    ("/v1/responses",
     {"input": [*ASK, {"type": "reasoning", "id": "rs_1", "summary": [],
                       "content": [{"type": "reasoning_text", "text": GIVEN}]},
                {"role": "assistant", "content": "Yo"}, *ASK]},
     {"input": [*ASK, {"role": "assistant", "content": "Yo"}, *ASK]}),
])
def test_reasoning_given_back_reaches_the_template(served, base, path, with_reasoning,
                                                   without):
    markup = len("<think></think>" + GIVEN)  # one token a character
    assert prompt_tokens(base, path, with_reasoning) == \
        prompt_tokens(base, path, without) + markup
    # The Harmony template drops past reasoning: the same prompt with it or without.
    served[1].use_chat_template(chat_template_source("harmony"))
    assert prompt_tokens(base, path, with_reasoning) == prompt_tokens(base, path, without)


def test_bad_reasoning_given_back_is_refused_by_name(base):
    status, reply = post(base, "/v1/chat/completions", {"max_tokens": 1, "messages": [
        *ASK, {"role": "assistant", "content": "Yo", "reasoning_content": 7}, *ASK]})
    assert status == 400 and reply["error"]["param"] == "messages[1].reasoning_content"
    status, reply = post(base, "/v1/messages", {"max_tokens": 1, "messages": [
        *ASK, {"role": "assistant", "content": [{"type": "thinking", "thinking": None}]}, *ASK]})
    assert status == 400 and "messages[1].content[0].thinking" in json.dumps(reply)
    status, reply = post(base, "/v1/responses", {"max_output_tokens": 1, "input": [
        *ASK, {"type": "reasoning", "summary": "not a list"}, *ASK]})
    assert status == 400 and reply["error"]["param"] == "input[1].summary"
    status, reply = post(base, "/v1/responses", {"max_output_tokens": 1, "input": [
        *ASK, {"type": "reasoning", "content": [{"type": "reasoning_text", "text": 5}]},
        {"role": "assistant", "content": "Yo"}, *ASK]})
    assert status == 400 and reply["error"]["param"] == "input[1].content"
    # The extension itself: true or false, refused by name in each API.
    for path, body in (("/v1/chat/completions", {"messages": ASK, "max_tokens": 1}),
                       ("/v1/messages", {"messages": ASK, "max_tokens": 1}),
                       ("/v1/responses", {"input": "Hi", "max_output_tokens": 1})):
        status, reply = post(base, path, {**body, "separate_reasoning": "no"})
        assert status == 400 and reply["error"]["param"] == "separate_reasoning", (path, reply)
        status, reply = post(base, path, {**body, "separate_reasoning": False})
        assert status == 200, (path, reply)  # the control: a boolean is served


def test_a_template_without_reasoning_answers_as_before(live):
    url, _ = live
    status, reply = post(url, "/v1/chat/completions", {
        "messages": ASK, "max_tokens": 20, "seed": 1, "temperature": 1.0,
        "constraint": {"regex": SHAPE}})
    assert status == 200, reply
    assert set(reply["choices"][0]) == {"index", "message", "finish_reason", "logprobs",
                                        "receipt"}
    message = reply["choices"][0]["message"]
    assert set(message) == {"role", "content"}
    assert message["content"].startswith("<think>")  # the markup stays in the content


HARMONY_SHAPE = (r"<\|channel\|>analysis<\|message\|>[a-z ]{1,12}<\|end\|><\|start\|>assistant"
                 r"<\|channel\|>final<\|message\|>[a-z ]{1,12}")


def test_harmony_analysis_is_the_reasoning(served, base):
    served[1].use_chat_template(chat_template_source("harmony"))
    written = chat(base, separate_reasoning=False, constraint={"regex": HARMONY_SHAPE},
                   max_tokens=120)
    split = chat(base, constraint={"regex": HARMONY_SHAPE}, max_tokens=120)
    match = re.fullmatch(r"<\|channel\|>analysis<\|message\|>(.*)<\|end\|><\|start\|>assistant"
                         r"<\|channel\|>final<\|message\|>(.*)", written["message"]["content"])
    assert (split["message"]["reasoning_content"], split["message"]["content"]) == \
        match.groups()
    assert split["receipt"]["token_ids_sha256"] == written["receipt"]["token_ids_sha256"]


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]


def test_a_harmony_forced_call_is_constrained(served, base):
    tokenizer = served[1]
    tokenizer.use_chat_template(chat_template_source("harmony"))
    body = {"messages": ASK, "tools": TOOLS, "max_tokens": 150, "temperature": 1.0,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    # The grammar lets the reply reason first: the tiny model does, to the length limit.
    status, reply = post(base, "/v1/chat/completions", {**body, "seed": 0})
    assert status == 200, reply
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["reasoning_content"]
    assert not choice["message"]["content"] and "tool_calls" not in choice["message"]
    # Kept from "analysis" (its "a" all but banned where there is a choice), it calls.
    banned = {str(tokenizer.encode("a", add_special_tokens=False)[0]): -100}
    for seed in range(3):
        status, reply = post(base, "/v1/chat/completions", {**body, "seed": seed,
                                                            "logit_bias": banned})
        assert status == 200, reply
        choice = reply["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert isinstance(json.loads(call["function"]["arguments"])["city"], str)
        assert choice["message"]["reasoning_content"] is None
    # Streamed: the same call.
    deltas = [payload["choices"][0]["delta"] for _, payload in stream(
        base, "/v1/chat/completions", {**body, "seed": 2, "logit_bias": banned})
        if payload["choices"]]
    calls = [entry for delta in deltas for entry in delta.get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(c["function"]["arguments"] for c in calls) == call["function"]["arguments"]
    # Anthropic's forced tool (no logit_bias there): the reasoning as a thinking block,
    # streamed as whole.
    anthropic = {"messages": ASK, "max_tokens": 150, "temperature": 1.0, "seed": 2,
                 "tool_choice": {"type": "tool", "name": "get_weather"},
                 "tools": [{"name": t["function"]["name"],
                            "input_schema": t["function"]["parameters"]} for t in TOOLS]}
    status, message = post(base, "/v1/messages", anthropic)
    assert status == 200, message
    assert [b["type"] for b in message["content"]] == ["thinking"]
    assert streamed_blocks(base, anthropic)[0] == message["content"]
    # Negative control: under tool_choice auto the output is free and makes no call.
    status, reply = post(base, "/v1/chat/completions", {**body, "tool_choice": "auto",
                                                        "seed": 0, "logit_bias": banned})
    assert status == 200 and "tool_calls" not in reply["choices"][0]["message"]


REASON_THEN_CALL = (r"<\|channel\|>analysis<\|message\|>[a-z ]{1,8}<\|end\|><\|start\|>assistant"
                    r"<\|channel\|>commentary to=functions\.now <\|constrain\|>json<\|message\|>"
                    r"\{\}<\|call\|>")


def test_a_call_after_reasoning_is_a_call_in_each_api(served, base):
    served[1].use_chat_template(chat_template_source("harmony"))
    body = {"messages": ASK, "tools": TOOLS, "max_tokens": 150, "temperature": 1.0, "seed": 3,
            "constraint": {"regex": REASON_THEN_CALL}}
    status, reply = post(base, "/v1/chat/completions", body)
    assert status == 200, reply
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert [c["function"] for c in choice["message"]["tool_calls"]] == \
        [{"name": "now", "arguments": "{}"}]
    thought = choice["message"]["reasoning_content"]
    assert re.fullmatch("[a-z ]{1,8}", thought) and choice["message"]["content"] is None
    deltas = [payload["choices"][0]["delta"] for _, payload in
              stream(base, "/v1/chat/completions", body) if payload["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == thought
    assert [c["function"]["name"] for d in deltas for c in d.get("tool_calls", [])] == ["now"]
    assert "".join(d.get("content") or "" for d in deltas) == ""
    anthropic = {**body, "tools": [{"name": t["function"]["name"],
                                    "input_schema": t["function"]["parameters"]}
                                   for t in TOOLS]}
    status, message = post(base, "/v1/messages", anthropic)
    assert status == 200, message
    assert message["stop_reason"] == "tool_use"
    assert [(b["type"], b.get("thinking", b.get("name"))) for b in message["content"]] == \
        [("thinking", thought), ("tool_use", "now")]
    blocks, _ = streamed_blocks(base, anthropic)
    assert [(b["type"], b.get("thinking", b.get("name"))) for b in blocks] == \
        [("thinking", thought), ("tool_use", "now")]
