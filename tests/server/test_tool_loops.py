"""Tool loops as agent clients run them, on the tiny llama server (character tokens, greedy):
a call cut by max_tokens at every token of it, in both APIs, whole and streamed, never fails
the request, never comes back as a call whose arguments do not parse, leaves no call markup in
the text, and the reply goes back into the history as it is; a named or forced tool_choice gives
exactly one call where the same model writes several when parallel calls are asked for; the
arguments are compact JSON; the objects of a tool's schema are closed unless the request sends
`"closed_objects": false`; a schema that cannot be followed is refused naming its field.

Calls are made deterministic two ways: a named tool_choice (the call grammar forces the markup
and the schema the arguments), and, for a reply that opens with text, the `constraint`
extension forcing `Sure.` and then the call's markup in tool_choice auto (the text is read for
calls as any auto reply is)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from exactdraft.server.json_schemas import closed
from tests.server.conftest import MODEL
from tests.server.live import post

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 4}},
          "required": ["city"]}
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "input_schema": SCHEMA}]
USER = [{"role": "user", "content": "weather?"}]
NAMED = {"openai": {"type": "function", "function": {"name": "get_weather"}},
         "anthropic": {"type": "tool", "name": "get_weather"}}
# Text, then a call, in tool_choice auto: the call's markup as the generic tools prompt asks.
LEAD = "Sure.\n"
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
FORCED = {"grammar": "start: " + json.dumps(LEAD + '<tool_call>{"name": "get_weather", '
                                            '"arguments": ')
          + " %json " + json.dumps({**closed(SCHEMA), "x-guidance": COMPACT})
          + ' "}</tool_call>"\n'}
MARKERS = ("<tool_call>", "</tool_call>")


def request(api: str, max_tokens: int, how: str, stream: bool = False, **fields) -> dict:
    """A body asking for a call: `how` is "named" or "forced" (text first, see the module)."""
    body = {"model": MODEL, "messages": USER, "max_tokens": max_tokens, "temperature": 0,
            "stream": stream,
            "tools": OPENAI_TOOLS if api == "openai" else ANTHROPIC_TOOLS, **fields}
    if how == "named":
        body["tool_choice"] = NAMED[api]
    else:
        body["constraint"] = FORCED
    if stream and api == "openai":
        body["stream_options"] = {"include_usage": True}
    return body


def events(base: str, path: str, body: dict) -> tuple[int, list[dict]]:
    """(status, the JSON payloads of a stream's data lines)."""
    data = json.dumps(body).encode()
    http = urllib.request.Request(base + path, data=data,
                                  headers={"content-type": "application/json"})
    with urllib.request.urlopen(http, timeout=120) as response:
        return response.status, [json.loads(line[6:]) for line in response
                                 if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]"]


def ask(base: str, api: str, body: dict) -> dict:
    """The reply as (content, calls, finish, output tokens, the message to send back),
    assembled from the stream when the body streams. Any status but 200 fails here."""
    path = "/v1/chat/completions" if api == "openai" else "/v1/messages"
    if not body.get("stream"):
        status, reply = post(base, path, body)
        assert status == 200, reply
        if api == "openai":
            choice = reply["choices"][0]
            message = choice["message"]
            calls = [(c["function"]["name"], c["function"]["arguments"])
                     for c in message.get("tool_calls", [])]
            return dict(content=message["content"] or "", calls=calls,
                        finish=choice["finish_reason"],
                        tokens=reply["usage"]["completion_tokens"], message=message)
        texts = [b["text"] for b in reply["content"] if b["type"] == "text"]
        calls = [(b["name"], json.dumps(b["input"])) for b in reply["content"]
                 if b["type"] == "tool_use"]
        return dict(content="".join(texts), calls=calls, finish=reply["stop_reason"],
                    tokens=reply["usage"]["output_tokens"],
                    message={"role": "assistant", "content": reply["content"]})
    status, payloads = events(base, path, body)
    assert status == 200
    assert not any("error" in p for p in payloads), payloads
    return assemble_openai(payloads) if api == "openai" else assemble_anthropic(payloads)


def assemble_openai(payloads: list[dict]) -> dict:
    content, calls, finish = "", {}, None
    for payload in payloads[:-1]:
        (choice,) = payload["choices"]
        delta = choice["delta"]
        content += delta.get("content") or ""
        assert not any(marker in (delta.get("content") or "") for marker in MARKERS)
        for piece in delta.get("tool_calls", []):
            entry = calls.setdefault(piece["index"], {"id": piece.get("id"), "type": "function",
                                                      "function": {"name": None,
                                                                   "arguments": ""}})
            entry["function"]["name"] = entry["function"]["name"] or \
                piece["function"].get("name")
            entry["function"]["arguments"] += piece["function"].get("arguments", "")
        finish = choice["finish_reason"] or finish
    listed = [calls[i] for i in sorted(calls)]
    message = {"role": "assistant", "content": content or None}
    if listed:
        message["tool_calls"] = listed
    return dict(content=content, calls=[(c["function"]["name"], c["function"]["arguments"])
                                        for c in listed],
                finish=finish, tokens=payloads[-1]["usage"]["completion_tokens"],
                message=message)


def assemble_anthropic(payloads: list[dict]) -> dict:
    blocks, partial, finish, tokens = [], {}, None, None
    for payload in payloads:
        kind = payload["type"]
        if kind == "content_block_start":
            blocks.append(dict(payload["content_block"]))
        elif kind == "content_block_delta":
            delta = payload["delta"]
            if delta["type"] == "text_delta":
                assert not any(marker in delta["text"] for marker in MARKERS)
                blocks[payload["index"]]["text"] += delta["text"]
            else:
                partial[payload["index"]] = partial.get(payload["index"], "") + \
                    delta["partial_json"]
        elif kind == "message_delta":
            finish, tokens = payload["delta"]["stop_reason"], payload["usage"]["output_tokens"]
    for index, text in partial.items():
        blocks[index]["input"] = json.loads(text)
    texts = [b["text"] for b in blocks if b["type"] == "text"]
    calls = [(b["name"], json.dumps(b["input"])) for b in blocks if b["type"] == "tool_use"]
    return dict(content="".join(texts), calls=calls, finish=finish, tokens=tokens,
                message={"role": "assistant", "content": blocks})


def follow_up(api: str, reply: dict) -> list[dict]:
    """The history an agent sends next: the reply as it came, each call's result, a user turn
    when there was no call."""
    messages = [*USER, reply["message"]]
    if api == "openai":
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "rain"}
                     for c in reply["message"].get("tool_calls", [])]
        return messages + ([] if reply["calls"] else [{"role": "user", "content": "go on"}])
    results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "rain"}
               for b in reply["message"]["content"] if b["type"] == "tool_use"]
    return messages + [{"role": "user", "content": results or "go on"}]


CUT = {"openai": "length", "anthropic": "max_tokens"}
CALLED = {"openai": "tool_calls", "anthropic": "tool_use"}


def check_cut(base: str, api: str, how: str, size: int, whole: dict, stream: bool,
              history: bool) -> None:
    """The reply at max_tokens `size` (see the module docstring), with its controls: the
    tokens were written (the cut fell where asked) and a cut inside the call leaves no call."""
    reply = ask(base, api, request(api, size, how, stream))
    length = whole["tokens"]
    assert reply["tokens"] == size  # the model wrote `size` tokens
    for name, arguments in reply["calls"]:
        assert name == "get_weather" and set(json.loads(arguments)) == {"city"}
    assert not any(marker[:n] in reply["content"] for marker in MARKERS for n in (2, 4))
    if size < length:  # cut inside the text or the call: the text so far
        assert reply["finish"] == CUT[api]
        assert whole["content"].startswith(reply["content"].rstrip())
        # No call, unless the cut fell in the closing tag (the call's JSON had ended): one
        # character a token, and the whole reply's last token is the stop token.
        json_end = length - 1 - len("</tool_call>")
        assert reply["calls"] == ([] if size < json_end else whole["calls"]), size
    else:
        assert reply["finish"] == CALLED[api] and reply["calls"] == whole["calls"]
    if history:
        status, answer = post(base, "/v1/chat/completions" if api == "openai" else
                              "/v1/messages", {**request(api, 1, how),
                                               "messages": follow_up(api, reply)})
        assert status == 200, (size, answer)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("how", ["named", "forced"])
def test_a_call_cut_at_every_token_is_never_a_broken_call(live, api, how):
    """Whole replies at every max_tokens from 1 to the call's length; streamed replies and the
    history round trip at every third length and the last ten (the slow job: every length)."""
    base, _ = live
    whole = ask(base, api, request(api, 200, how))
    assert whole["finish"] == CALLED[api] and len(whole["calls"]) == 1
    assert whole["content"] == ("" if how == "named" else LEAD.strip())
    length = whole["tokens"]
    assert length > 40  # the call's markup is many tokens, so most cuts fall inside it
    for size in range(1, length + 1):
        near = size % 3 == 0 or size > length - 10
        check_cut(base, api, how, size, whole, stream=False, history=near)
        if near:
            check_cut(base, api, how, size, whole, stream=True, history=False)


@pytest.mark.slow
@pytest.mark.parametrize("api", ["openai", "anthropic"])
@pytest.mark.parametrize("how", ["named", "forced"])
def test_a_call_cut_at_every_token_streamed_and_sent_back(live, api, how):
    base, _ = live
    whole = ask(base, api, request(api, 200, how))
    for size in range(1, whole["tokens"] + 1):
        check_cut(base, api, how, size, whole, stream=False, history=True)
        check_cut(base, api, how, size, whole, stream=True, history=True)


def calls_of(base: str, api: str, **fields) -> dict:
    body = {**request(api, 200, "named"), **fields}
    return ask(base, api, body)


@pytest.mark.parametrize("api, choice, extra", [
    ("openai", NAMED["openai"], {}),
    ("openai", NAMED["openai"], {"parallel_tool_calls": True}),  # named: one call whatever
    ("openai", "required", {}),
    ("anthropic", NAMED["anthropic"], {}),
    ("anthropic", {"type": "any"}, {}),
])
def test_a_named_or_forced_choice_gives_exactly_one_call(live, api, choice, extra):
    base, _ = live
    reply = calls_of(base, api, tool_choice=choice, **extra)
    assert reply["finish"] == CALLED[api] and len(reply["calls"]) == 1, reply


@pytest.mark.parametrize("api, choice", [
    ("openai", "required"), ("anthropic", {"type": "any", "disable_parallel_tool_use": False})])
def test_the_same_model_writes_several_calls_when_parallel_calls_are_asked_for(live, api,
                                                                               choice):
    """The control of the test above: asked for parallel calls, this model writes a second
    call (and more, until max_tokens cuts one, which is dropped)."""
    base, _ = live
    fields = {"parallel_tool_calls": True} if api == "openai" else {}
    reply = calls_of(base, api, tool_choice=choice, **fields)
    assert len(reply["calls"]) >= 2, reply
    assert all(set(json.loads(arguments)) == {"city"} for _, arguments in reply["calls"])


def test_arguments_are_compact_json(live):
    """Arguments are written as response_format's JSON is: no free whitespace. Control: the
    same call markup under a grammar with JSON's free whitespace (the constraint extension, no
    tools, so the raw text comes back) lets this model write newlines and tabs there."""
    base, _ = live
    for api in ("openai", "anthropic"):
        (call,) = calls_of(base, api)["calls"]
        assert call[1] == json.dumps(json.loads(call[1]))
    compact = json.dumps({**closed(SCHEMA), "x-guidance": COMPACT})
    loose = FORCED["grammar"].replace(compact, json.dumps(closed(SCHEMA)))
    assert loose != FORCED["grammar"]
    for grammar, free in ((FORCED["grammar"], False), (loose, True)):
        status, reply = post(base, "/v1/chat/completions", {
            "model": MODEL, "messages": USER, "max_tokens": 120, "temperature": 0,
            "constraint": {"grammar": grammar}})
        assert status == 200, reply
        arguments = reply["choices"][0]["message"]["content"].split('"arguments": ', 1)[1]
        assert any(space in arguments for space in "\n\t") is free, arguments


def accepts(constraint, text: str) -> bool:
    """Whether llguidance's matcher takes `text` whole (one token per byte)."""
    import llguidance

    from exactdraft.constraints.tokens import byte_tokenizer

    matcher = llguidance.LLMatcher(byte_tokenizer(), constraint.llguidance_grammar, log_level=0)
    return bool(matcher.consume_tokens(list(text.encode()))) and matcher.is_accepting()


OPEN = {"type": "object", "properties": {"city": {"type": "string"},
                                         "when": {"type": "object",
                                                  "properties": {"day": {"type": "integer"}}}}}


@pytest.mark.parametrize("closed_objects", [True, False])
def test_schema_objects_are_closed_unless_the_request_opens_them(closed_objects):
    """A schema without additionalProperties gets no other key, at any depth, in a tool's
    arguments and in a strict response_format; `"closed_objects": false` gives JSON Schema's
    open objects back (the control: the same texts accepted)."""
    from exactdraft.server.fields import constraint_from
    from exactdraft.server.tool_calls.requests import constraint_for, openai_tools

    body = {"tools": [{"type": "function", "function": {"name": "f", "parameters": OPEN}}],
            "tool_choice": NAMED["openai"] | {"function": {"name": "f"}},
            "closed_objects": closed_objects}
    tool = constraint_for(openai_tools(body, None)).build(None)
    head = '<tool_call>{"name": "f", "arguments": '
    assert accepts(tool, head + '{"city": "x", "when": {"day": 1}}}</tool_call>')
    for extra in ('{"city": "x", "mood": 1}', '{"when": {"day": 1, "hour": 2}}'):
        assert accepts(tool, head + extra + "}</tool_call>") is not closed_objects
    strict = constraint_from({"response_format": {"type": "json_schema", "json_schema": {
        "name": "r", "strict": True, "schema": OPEN}}, "closed_objects": closed_objects})
    strict = strict.build(None)
    assert accepts(strict, '{"city": "x"}')
    assert accepts(strict, '{"city": "x", "mood": 1}') is not closed_objects
    # Not strict: JSON Schema's own reading, open.
    loose = constraint_from({"response_format": {"type": "json_schema", "json_schema": {
        "name": "r", "schema": OPEN}}}).build(None)
    assert accepts(loose, '{"city": "x", "mood": 1}')


@pytest.mark.parametrize("api, tools, field", [
    ("openai", [OPENAI_TOOLS[0], {"type": "function", "function": {
        "name": "bad", "parameters": {"type": "object",
                                      "properties": {"a": {"type": "strin"}}}}}],
     "tools[1].function.parameters"),
    ("anthropic", [ANTHROPIC_TOOLS[0], {"name": "bad", "input_schema": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}],
     "tools[1].input_schema"),
])
def test_a_schema_that_cannot_be_followed_is_refused_naming_its_field(live, api, tools, field):
    base, _ = live
    body = {**request(api, 8, "named"), "tools": tools,
            "tool_choice": {"type": "any"} if api == "anthropic" else "required"}
    status, reply = post(base, "/v1/chat/completions" if api == "openai" else "/v1/messages",
                         body)
    assert status == 400 and reply["error"]["param"] == field, reply
    assert "%json" not in reply["error"]["message"] and "start:" not in reply["error"]["message"]
    # Control: the good tool alone is served.
    status, _ = post(base, "/v1/chat/completions" if api == "openai" else "/v1/messages",
                     {**body, "tools": tools[:1]})
    assert status == 200
    # A bad type for the extension field is refused by name.
    status, reply = post(base, "/v1/chat/completions" if api == "openai" else "/v1/messages",
                         {**body, "tools": tools[:1], "closed_objects": "no"})
    assert status == 400 and reply["error"]["param"] == "closed_objects"
