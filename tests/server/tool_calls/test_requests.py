"""Tool calling through the server.

End to end (SmolLM2 with the generic tools prompt, greedy, served with prompt-lookup drafting):
the official openai client gets a tool call whole and streamed and answers a `role: tool`
follow-up; the official anthropic client does the tool_use round trip (call, tool_result,
answer) whole and streamed. SmolLM2 writes the generic call markup after a history holding two
earlier calls (an agent's history). Each answer's tokens are the Python API's serial tokens for
the same rendered prompt (the receipt's digests).

Unit (the response builders fed known model text): every format's calls come out as OpenAI
tool_calls and Anthropic tool_use blocks, whole and streamed in small pieces, with the stream
assembling to the whole response and no call markup in any text delta.

Bad input (the tiny llama server): a 4xx naming the field, and the server keeps serving.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

import exactdraft as xd
from exactdraft.decoding import Chunk
from exactdraft.loading.chat_template import render_chat_with_tools
from exactdraft.results import token_digest
from exactdraft.server import anthropic_api, openai_api
from exactdraft.server.fields import Wanted
from exactdraft.server.service import Service
from exactdraft.server.tool_calls.formats import format_named
from exactdraft.server.tool_calls.replies import assembled_blocks
from exactdraft.server.tool_calls.requests import ToolRequest
from tests.conftest import needs_smollm2
from tests.server.conftest import MODEL
from tests.server.live import post, server_in_thread

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FUNCTION = {"name": "get_weather", "description": "Get the current weather in a city",
            "parameters": SCHEMA}
OPENAI_TOOLS = [{"type": "function", "function": FUNCTION}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": FUNCTION["description"],
                    "input_schema": SCHEMA}]


def openai_history(question: str) -> list[dict]:
    """Two earlier rounds (question, call, result, answer), then `question`."""
    messages = []
    for number, city in enumerate(["London", "Rome"]):
        messages += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{number}", "type": "function", "function": {
                    "name": "get_weather", "arguments": json.dumps({"city": city})}}]},
            {"role": "tool", "tool_call_id": f"call_{number}", "content": "sunny, 21 C"},
            {"role": "assistant", "content": f"It is sunny and 21 C in {city}."}]
    return messages + [{"role": "user", "content": question}]


def anthropic_history(question: str) -> list[dict]:
    messages = []
    for number, city in enumerate(["London", "Rome"]):
        messages += [
            {"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{number}",
                                               "name": "get_weather",
                                               "input": {"city": city}}]},
            {"role": "user", "content": [{"type": "tool_result",
                                          "tool_use_id": f"toolu_{number}",
                                          "content": "sunny, 21 C"}]},
            {"role": "assistant", "content": f"It is sunny and 21 C in {city}."}]
    return messages + [{"role": "user", "content": question}]


def serial_receipt(generator, messages: list[dict], max_tokens: int) -> dict:
    """The prompt and token digests of the Python API's serial greedy run on the rendered chat
    (the messages in the internal form: arguments as objects)."""
    text = render_chat_with_tools(generator.tokenizer, messages, [FUNCTION])
    ids = generator.tokenizer.encode(text, add_special_tokens=False)
    # Negative control: the same chat rendered without its tools is another prompt.
    bare = render_chat_with_tools(generator.tokenizer, messages, [])
    assert token_digest(generator.tokenizer.encode(bare, add_special_tokens=False)) != \
        token_digest(ids)
    tokens = generator.generate(ids, max_new_tokens=max_tokens, temperature=0,
                                drafts=False).tokens
    return {"prompt_ids_sha256": token_digest(ids), "token_ids_sha256": token_digest(tokens)}


def digests(receipt: dict) -> dict:
    return {k: receipt[k] for k in ("prompt_ids_sha256", "token_ids_sha256")}


def internal(messages: list[dict]) -> list[dict]:
    """OpenAI messages in the form the renderer takes (arguments parsed, tool names added)."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["content"] = message.get("content") or ""
            message["tool_calls"] = [{**c, "function": {
                "name": c["function"]["name"],
                "arguments": json.loads(c["function"]["arguments"])}}
                for c in message["tool_calls"]]
        if message["role"] == "tool":
            message["name"] = "get_weather"
        out.append(message)
    return out


@needs_smollm2
def test_openai_client_tool_call_whole_streamed_and_answered(smollm2_server):
    base, generator = smollm2_server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    messages = openai_history("What is the weather in Paris?")
    options = dict(model="smollm2", messages=messages, tools=OPENAI_TOOLS, temperature=0,
                   max_tokens=40)
    whole = client.chat.completions.create(**options)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert digests(choice.model_extra["receipt"]) == \
        serial_receipt(generator, internal(messages), 40)

    chunks = list(client.chat.completions.create(stream=True, **options))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert all("<tool_call>" not in (d.content or "") for d in deltas)
    assert "".join(d.content or "" for d in deltas).strip() == ""
    pieces = [t for d in deltas for t in (d.tool_calls or [])]
    assert pieces[0].index == 0 and pieces[0].id and pieces[0].function.name == "get_weather"
    assert all(p.index == 0 and p.id is None for p in pieces[1:])
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    follow_up = [*messages, choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "rainy, 12 C"}]
    answer = client.chat.completions.create(model="smollm2", messages=follow_up,
                                            tools=OPENAI_TOOLS, temperature=0, max_tokens=40)
    reply = answer.choices[0]
    assert reply.finish_reason == "stop" and not reply.message.tool_calls
    assert "Paris" in reply.message.content and "<tool" not in reply.message.content
    rendered = internal(follow_up)
    rendered[-2]["tool_calls"][0]["id"] = call.id
    assert digests(reply.model_extra["receipt"]) == serial_receipt(generator, rendered, 40)


@needs_smollm2
def test_anthropic_client_tool_use_round_trip_whole_and_streamed(smollm2_server):
    base, _ = smollm2_server
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    messages = anthropic_history("What is the weather in Paris?")
    options = dict(model="smollm2", messages=messages, tools=ANTHROPIC_TOOLS, max_tokens=40,
                   extra_body={"temperature": 0})
    whole = client.messages.create(**options)
    assert whole.stop_reason == "tool_use"
    (use,) = [b for b in whole.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    assert all(b.type != "text" or "<tool_call>" not in b.text for b in whole.content)

    with client.messages.stream(**options) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in events]
    assert ("content_block_delta", "input_json_delta") in kinds
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == [b.type for b in whole.content]
    assert all("<tool_call>" not in getattr(e.delta, "text", "") for e in events
               if e.type == "content_block_delta")
    assert streamed.stop_reason == "tool_use"
    (streamed_use,) = [b for b in streamed.content if b.type == "tool_use"]
    assert (streamed_use.name, streamed_use.input) == (use.name, use.input)

    answer_messages = [*messages, {"role": "assistant", "content": [
        {"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": [{"type": "text", "text": "rainy, 12 C"}]}]}]
    answer = client.messages.create(**{**options, "messages": answer_messages})
    assert answer.stop_reason == "end_turn"
    assert [b.type for b in answer.content] == ["text"] and "Paris" in answer.content[0].text
    with client.messages.stream(**{**options, "messages": answer_messages}) as stream:
        text = "".join(stream.text_stream)
    assert text == answer.content[0].text


# -- the response builders fed known model text ---------------------------------------------

TEXTS = {
    "generic": 'Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'
               '</tool_call>',
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
              '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
              "\n</tool_call>",
    "qwen3-xml": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                 "</function>\n</tool_call>",
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "gemma": 'Checking. ```tool_code\nget_weather(city="Paris")\n```',
    "harmony": '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
               '{"city": "Paris"}<|call|>',
}


@pytest.fixture(scope="module")
def service_and_result(live, served_generator):
    """A Service over the live tiny server's engine and a real result to dress up."""
    _, engine = live
    return Service(engine, MODEL), served_generator.generate([5, 6, 7], max_new_tokens=2)


def replay(reply_chunks, text: str, result, size: int = 3):
    """The reply's output for `text` cut into `size`-character chunks, the last finishing."""
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    final = dataclasses.replace(result, text=text, finish_reason="stop", stop=None)
    return [reply_chunks(Chunk([], piece, final if i == len(pieces) - 1 else None), i == 0)
            for i, piece in enumerate(pieces)]


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_openai_stream_of_any_format_assembles_to_the_whole_response(service_and_result, name):
    service, result = service_and_result
    text = TEXTS[name]
    request = ToolRequest([FUNCTION], format=format_named(name))
    wanted = Wanted(prompt=[1], max_tokens=8, tools=request)
    whole = openai_api.Reply(service, True, wanted, [1]).whole(
        [dataclasses.replace(result, text=text, finish_reason="stop", stop=None)])
    message = whole["choices"][0]["message"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    assert [json.loads(c["function"]["arguments"])["city"] for c in message["tool_calls"]] \
        == (["Paris", "Oslo"] if name == "hermes" else ["Paris"])

    reply = openai_api.Reply(service, True, wanted, [1])
    chunks = replay(lambda c, first: reply.chunk(0, c, first, 0), text, result)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    content = "".join(d.get("content") or "" for d in deltas)
    assert content == (message["content"] or "")
    calls: dict[int, dict] = {}
    for delta in deltas:
        for piece in delta.get("tool_calls", []):
            if "id" in piece:
                assert piece["index"] not in calls
                calls[piece["index"]] = {"id": piece["id"], "type": piece["type"],
                                         "function": dict(piece["function"])}
            else:
                calls[piece["index"]]["function"]["arguments"] += \
                    piece["function"]["arguments"]
    assert [calls[i] for i in sorted(calls)] == [
        {**c, "id": calls[i]["id"]} for i, c in enumerate(message["tool_calls"])]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # Negative control: the raw text streamed without tools carries the markup.
    plain = openai_api.Reply(service, True, Wanted(prompt=[1], max_tokens=8), [1])
    raw = replay(lambda c, first: plain.chunk(0, c, first, 0), text, result)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in raw) == text


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_anthropic_stream_of_any_format_assembles_to_the_whole_message(service_and_result,
                                                                       name):
    service, result = service_and_result
    text = TEXTS[name]
    wanted = Wanted(prompt=[1], max_tokens=8,
                    tools=ToolRequest([FUNCTION], format=format_named(name)))
    whole = anthropic_api.Reply(service, wanted, [1]).whole(
        [dataclasses.replace(result, text=text, finish_reason="stop", stop=None)])
    assert whole["stop_reason"] == "tool_use"
    reply = anthropic_api.Reply(service, wanted, [1])
    events = reply.start_events() + [
        e for batch in replay(lambda c, _: reply.chunk_events(c), text, result) for e in batch]
    blocks: list[dict] = []
    partial: dict[int, str] = {}
    for kind, payload in events:
        if kind == "content_block_start":
            assert payload["index"] == len(blocks)
            blocks.append(dict(payload["content_block"]))
        elif kind == "content_block_delta":
            delta = payload["delta"]
            if delta["type"] == "text_delta":
                assert "<tool_call>" not in delta["text"] and "```tool_code" not in delta["text"]
                blocks[payload["index"]]["text"] += delta["text"]
            else:
                partial[payload["index"]] = partial.get(payload["index"], "") + \
                    delta["partial_json"]
        elif kind == "message_delta":
            assert payload["delta"]["stop_reason"] == "tool_use"
    for index, text_json in partial.items():
        blocks[index]["input"] = json.loads(text_json)
    ids = [b["id"] for b in blocks if b["type"] == "tool_use"]
    assert blocks == [{**b, "id": ids.pop(0)} if b["type"] == "tool_use" else b
                      for b in whole["content"]]
    assert [kind for kind, _ in events].count("content_block_start") == \
        [kind for kind, _ in events].count("content_block_stop")


# -- bad input --------------------------------------------------------------------------------

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
USER = [{"role": "user", "content": "hi"}]
CALLED = [{"role": "user", "content": "hi"},
          {"role": "assistant", "content": None, "tool_calls": [
              {"id": "c1", "type": "function",
               "function": {"name": "get_weather", "arguments": '{"city": "X"}'}}]}]
USED = [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                                           "name": "get_weather", "input": {}}]}]
BAD = [
    (CHAT, dict(tools=[{"type": "function", "function": {"description": "x"}}]),
     "tools[0].function.name"),
    (CHAT, dict(tools=[{"type": "function"}]), "tools[0].function"),
    (CHAT, dict(tools=[{"type": "function", "function": {"name": "a b"}}]),
     "tools[0].function.name"),
    (CHAT, dict(tools=OPENAI_TOOLS * 2), "tools[1]"),
    (CHAT, dict(tools=[{"type": "function", "function": {**FUNCTION, "parameters": "x"}}]),
     "tools[0].function.parameters"),
    (CHAT, dict(tools=[{"type": "retrieval"}]), "tools[0].type"),
    (CHAT, dict(tools=OPENAI_TOOLS, tool_choice={"type": "function",
                                                 "function": {"name": "launch"}}),
     "tool_choice"),
    (CHAT, dict(tools=OPENAI_TOOLS, tool_choice="always"), "tool_choice"),
    (CHAT, dict(tool_choice="required"), "tool_choice"),
    (CHAT, dict(tools=OPENAI_TOOLS, parallel_tool_calls="yes"), "parallel_tool_calls"),
    (CHAT, dict(messages=[*CALLED, {"role": "tool", "tool_call_id": "c9", "content": "x"}]),
     "messages[2].tool_call_id"),
    (CHAT, dict(messages=[*USER, {"role": "tool", "content": "x"}]),
     "messages[1].tool_call_id"),
    (CHAT, dict(messages=[USER[0], {**CALLED[1], "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": '}}]}]),
     "messages[1].tool_calls[0].function.arguments"),
    (CHAT, dict(messages=[USER[0], {**CALLED[1], "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                      "arguments": "[1]"}}]}]),
     "messages[1].tool_calls[0].function.arguments"),
    (CHAT, dict(messages=[USER[0], {**CALLED[1], "tool_calls": [{"id": "c1"}]}]),
     "messages[1].tool_calls[0]"),
    (MESSAGES, dict(tools=[{"description": "x", "input_schema": SCHEMA}]), "tools[0].name"),
    (MESSAGES, dict(tools=[{"name": "get_weather"}]), "tools[0].input_schema"),
    (MESSAGES, dict(tools=[{"type": "web_search_20250305", "name": "web_search"}]),
     "tools[0].type"),
    (MESSAGES, dict(tools=ANTHROPIC_TOOLS, tool_choice={"type": "tool", "name": "launch"}),
     "tool_choice.name"),
    (MESSAGES, dict(tools=ANTHROPIC_TOOLS, tool_choice={"type": "sometimes"}), "tool_choice"),
    (MESSAGES, dict(tools=ANTHROPIC_TOOLS, tool_choice="auto"), "tool_choice"),
    (MESSAGES, dict(messages=[*USED, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t9", "content": "x"}]}]),
     "messages[2].content[0].tool_use_id"),
    (MESSAGES, dict(messages=[{"role": "user", "content": [
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}]}]),
     "messages[0].content[0].type"),
    (MESSAGES, dict(messages=[USED[0], {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": "{"}]}]),
     "messages[1].content[0].input"),
]
GOOD = {CHAT: {"model": MODEL, "messages": USER, "max_tokens": 4},
        MESSAGES: {"model": MODEL, "messages": USER, "max_tokens": 4}}


@pytest.mark.parametrize("path, fields, param", BAD, ids=[f"{p[4:]}-{n}" for p, _, n in BAD])
def test_bad_tool_input_is_refused_by_name_and_the_server_goes_on(live, path, fields, param):
    base, _ = live
    status, reply = post(base, path, {**GOOD[path], **fields})
    assert status == 400, reply
    assert reply["error"]["param"] == param, reply
    status, reply = post(base, path, GOOD[path])
    assert status == 200, reply


def test_good_tool_requests_are_served(live):
    """The controls of the cases above: the same shapes, well formed, get 200."""
    base, _ = live
    for path, body in [
        (CHAT, dict(tools=OPENAI_TOOLS, tool_choice={"type": "function",
                                                     "function": {"name": "get_weather"}},
                    parallel_tool_calls=False)),
        (CHAT, dict(messages=[*CALLED, {"role": "tool", "tool_call_id": "c1",
                                        "content": "x"}], tool_choice="none",
                    tools=OPENAI_TOOLS)),
        (MESSAGES, dict(tools=ANTHROPIC_TOOLS, tool_choice={
            "type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})),
        (MESSAGES, dict(messages=[*USED, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "x", "is_error": True},
            {"type": "text", "text": "go on"}]}])),
    ]:
        status, reply = post(base, path, {**GOOD[path], **body, "max_tokens": 2})
        assert status == 200, (path, reply)


def test_a_broken_call_in_the_model_text_is_content(service_and_result, caplog):
    """Arguments that do not parse are not passed on as a call: the model's text goes back as
    content, as written, through both APIs whole and streamed (finish "stop", "end_turn"),
    and the server logs why. Control: the same text with valid arguments is a call."""
    service, result = service_and_result
    text = 'Hm. <tool_call>{"name": "get_weather", "arguments": {"city": Paris}}</tool_call>'
    wanted = Wanted(prompt=[1], max_tokens=8, tools=ToolRequest([FUNCTION]))
    final = dataclasses.replace(result, text=text, finish_reason="stop", stop=None)
    whole = openai_api.Reply(service, True, wanted, [1]).whole([final])["choices"][0]
    assert whole["message"] == {"role": "assistant", "content": text}
    assert whole["finish_reason"] == "stop"
    assert any("tool call 0 (get_weather) is not valid JSON" in record.getMessage()
               for record in caplog.records if record.name == "exactdraft.server.tool_calls")
    message = anthropic_api.Reply(service, wanted, [1]).whole([final])
    assert message["content"] == [{"type": "text", "text": text}]
    assert message["stop_reason"] == "end_turn"
    reply = openai_api.Reply(service, True, wanted, [1])
    chunks = replay(lambda c, first: reply.chunk(0, c, first, 0), text, result)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == text
    assert not any("tool_calls" in d for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    reply = anthropic_api.Reply(service, wanted, [1])
    events = reply.start_events() + [
        e for batch in replay(lambda c, _: reply.chunk_events(c), text, result) for e in batch]
    assert assembled_blocks(events) == [{"type": "text", "text": text}]
    assert [p["delta"]["stop_reason"] for k, p in events if k == "message_delta"] == ["end_turn"]
    # Control: the same text with valid arguments is a call.
    fixed = dataclasses.replace(final, text=text.replace("Paris", '"Paris"'))
    assert openai_api.Reply(service, True, wanted, [1]).whole([fixed])["choices"][0][
        "message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


def test_a_template_with_tools_renders_natively_through_both_apis(tmp_path):
    """A tiny checkpoint carrying the Qwen3-style template: a request with tools and a call
    and result in its history is rendered by the template itself, byte for byte as
    transformers renders it (the receipt's prompt digest), the same from both APIs."""
    transformers = pytest.importorskip("transformers")
    from exactdraft.loading.tokenizer import Tokenizer
    from tests.conftest import build_tiny_checkpoint
    from tests.loading.test_chat_template_tools import QWEN3

    folder = build_tiny_checkpoint(str(tmp_path), "qwen3")
    with open(tmp_path / "tokenizer_config.json") as handle:
        config = json.load(handle)
    with open(tmp_path / "tokenizer_config.json", "w") as handle:
        json.dump({**config, "chat_template": QWEN3}, handle)
    chat = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "rain"}]
    expected = transformers.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        chat, tools=OPENAI_TOOLS, tokenize=False, add_generation_prompt=True)
    assert "<tools>" in expected and "<tool_response>\nrain" in expected
    digest = token_digest(Tokenizer.from_folder(folder).encode(expected,
                                                               add_special_tokens=False))
    generator = xd.Generator.from_pretrained(folder, "torch", progress=False)
    openai_chat = [chat[0], {**chat[1], "tool_calls": [{**chat[1]["tool_calls"][0], "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {k: v for k, v in chat[2].items() if k != "name"}]
    anthropic_chat = [chat[0], {"role": "assistant", "content": [
        {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                                      "content": "rain"}]}]
    with server_in_thread(generator, "tiny-qwen3") as (base, _):
        status, whole = post(base, CHAT, {"messages": openai_chat, "tools": OPENAI_TOOLS,
                                          "max_tokens": 2})
        assert status == 200, whole
        assert whole["choices"][0]["receipt"]["prompt_ids_sha256"] == digest
        status, message = post(base, MESSAGES, {"messages": anthropic_chat, "max_tokens": 2,
                                                "tools": ANTHROPIC_TOOLS})
        assert status == 200, message
        assert message["receipt"]["prompt_ids_sha256"] == digest
        # Negative control: without the tools the prompt differs.
        status, bare = post(base, CHAT, {"messages": openai_chat, "max_tokens": 2})
        assert bare["choices"][0]["receipt"]["prompt_ids_sha256"] != digest


def test_a_call_cut_by_max_tokens_is_dropped(service_and_result):
    """OpenAI: finish_reason length and the content before the call; Anthropic: max_tokens and
    the text block; no call with arguments cut short in either (tests/server/test_tool_loops.py
    cuts live calls at every token)."""
    service, result = service_and_result
    text = 'A. <tool_call>{"name": "get_weather", "arguments": {"city": "Pa'
    wanted = Wanted(prompt=[1], max_tokens=8, tools=ToolRequest([FUNCTION]))
    cut = dataclasses.replace(result, text=text, finish_reason="length", stop=None)
    choice = openai_api.Reply(service, True, wanted, [1]).whole([cut])["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"] == {"role": "assistant", "content": "A."}
    message = anthropic_api.Reply(service, wanted, [1]).whole([cut])
    assert message["stop_reason"] == "max_tokens"
    assert message["content"] == [{"type": "text", "text": "A."}]
    # Control: the same text, whole, is a call.
    whole = dataclasses.replace(cut, text=text + 'ris"}}</tool_call>', finish_reason="stop")
    assert anthropic_api.Reply(service, wanted, [1]).whole([whole])["content"][1]["input"] \
        == {"city": "Paris"}
