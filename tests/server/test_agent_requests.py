"""Long agent requests: a coding agent's session (tests/server/fixtures/agent_session.json, in
the request shape a command-line agent sends: system blocks with cache_control, tools with JSON
schemas, `thinking`, `context_management`, `output_config`, `metadata`, `stream: true`,
`max_tokens: 32000`) replayed against the server. Every answer is a 200 or one of the context
errors in the Anthropic API's own wording, which the agent reads to shorten its prompt
(`prompt is too long: N tokens > M maximum`) or to retry with a smaller max_tokens (``input
length and `max_tokens` exceed context limit: I + M > C``); the retry it makes is served, and
with `clamp_max_tokens` the first request is. OpenAI clients get the code
context_length_exceeded. Unknown routes answer a JSON 404 in the error shape of the API the
client speaks."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import exactdraft as xd
from tests.conftest import needs_smollm2
from tests.server.conftest import MODEL
from tests.server.live import post, server_in_thread

SESSION = json.loads((Path(__file__).parent / "fixtures" / "agent_session.json")
                     .read_text())["requests"]
AGENT = [r for r in SESSION if r["path"] == "/v1/messages" and r["body"].get("tools")]
FIT = re.compile(r"^input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+), "
                 r"decrease input length or `max_tokens` and try again$")


def send(base: str, path: str, body: dict, method: str = "POST",
         headers: dict | None = None) -> tuple[int, Any]:
    """(status, the JSON body, or a stream's events as (event, payload) pairs)."""
    data = None if method == "GET" else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"content-type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                lines = response.read().decode().splitlines()
                names = [line[7:] for line in lines if line.startswith("event: ")]
                payloads = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
                return response.status, list(zip(names, payloads))
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        assert error.headers.get("content-type") == "application/json"
        return error.code, json.loads(error.read())


def counted(base: str, body: dict) -> int:
    status, reply = post(base, "/v1/messages/count_tokens",
                         {k: v for k, v in body.items() if k not in ("stream", "max_tokens")})
    assert status == 200, reply
    return reply["input_tokens"]


def well_formed(events: list[tuple[str, dict]]) -> None:
    """A whole Anthropic stream: message_start first, message_stop last, no error event,
    every block started is stopped."""
    kinds = [name for name, _ in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert "error" not in kinds
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1


def test_the_session_on_a_short_context_gets_the_prompt_too_long_wording(live) -> None:
    """The tiny model's context is 1024 tokens: the agent's requests (over 4000) are refused
    in the Anthropic wording, before max_tokens (32000, past the context) is looked at; the
    small request of the session is served (the control: the replay reaches the model)."""
    base, _ = live
    statuses = []
    for entry in SESSION:
        status, reply = send(base, entry["path"], entry["body"])
        statuses.append(status)
        if status == 200:
            if entry["body"].get("stream"):
                well_formed(reply)
            continue
        assert status == 400, reply
        n = counted(base, entry["body"])
        assert reply == {"type": "error", "error": {
            "type": "invalid_request_error", "param": "messages",
            "message": f"prompt is too long: {n} tokens > 1023 maximum"}}
        assert entry["body"]["max_tokens"] > 1024
    assert statuses.count(400) == len(AGENT) == 2 and statuses.count(200) == 2


@pytest.fixture(scope="module")
def long_context_checkpoint(tmp_path_factory) -> str:
    """The tiny llama with positions for 8192 tokens (its weights as random as ever)."""
    from tests.conftest import build_tiny_checkpoint

    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("long")), "llama",
                                 max_position_embeddings=8192)


@pytest.mark.parametrize("clamp", [False, True])
def test_the_session_on_a_long_context_is_served_or_told_to_lower_max_tokens(
        live, long_context_checkpoint, clamp) -> None:
    """A context 40 tokens past the longest agent request: max_tokens 32000 does not fit, and
    the answer says so in the wording the agent parses; the retry with the room it names is
    served, streamed. With clamp_max_tokens the request itself is served, its output within
    the room. `thinking`, `context_management`, `output_config` and `metadata` are accepted."""
    base, _ = live
    sizes = [counted(base, entry["body"]) for entry in AGENT]
    context = max(sizes) + 40
    generator = xd.Generator.from_pretrained(long_context_checkpoint, "torch",
                                             max_context=context, progress=False)
    with server_in_thread(generator, MODEL, clamp_max_tokens=clamp) as (long_base, _):
        for entry, size in zip(AGENT, sizes):
            body = entry["body"]
            status, reply = send(long_base, "/v1/messages", body)
            if clamp:
                assert status == 200, reply
                well_formed(reply)
                (delta,) = [p for name, p in reply if name == "message_delta"]
                assert 1 <= delta["usage"]["output_tokens"] <= context - size
                continue
            assert status == 400, reply
            assert reply["error"]["type"] == "invalid_request_error"
            found = FIT.match(reply["error"]["message"])
            assert found, reply
            assert [int(g) for g in found.groups()] == [size, body["max_tokens"], context]
            room = context - size  # what the agent retries with
            status, retried = send(long_base, "/v1/messages", {**body, "max_tokens": room})
            assert status == 200, retried
            well_formed(retried)
            # Control: one token more than the room is refused again.
            status, again = send(long_base, "/v1/messages", {**body, "max_tokens": room + 1})
            assert status == 400 and FIT.match(again["error"]["message"])


def test_openai_context_errors_carry_context_length_exceeded(live) -> None:
    """The prompt alone too long (param messages) and prompt plus max_tokens past the context
    (param max_tokens), in OpenAI's error body; a max_tokens past the context with a short
    prompt is a context error, not a range error; one that fits is served (the control)."""
    base, _ = live
    user = [{"role": "user", "content": "abc"}]
    long = [{"role": "user", "content": "abc " * 300}]
    for messages, max_tokens, param in ((long, None, "messages"), (long, 32000, "messages"),
                                        (user, 32000, "max_tokens")):
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens}
        status, reply = post(base, "/v1/chat/completions", body)
        assert status == 400, reply
        error = reply["error"]
        assert (error["code"], error["type"], error["param"]) == \
            ("context_length_exceeded", "invalid_request_error", param), reply
        assert error["message"].startswith("This model's maximum context length is 1024 "
                                           "tokens. However, ")
        assert set(reply) == {"error"} and set(error) == {"message", "type", "param", "code"}
    status, reply = post(base, "/v1/chat/completions",
                         {"model": MODEL, "messages": user, "max_tokens": 1000})
    assert status == 200, reply
    status, reply = post(base, "/v1/completions",
                         {"model": MODEL, "prompt": "abc " * 300, "max_tokens": 2})
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    assert reply["error"]["param"] == "prompt"


@pytest.mark.parametrize("method, path, headers, status, anthropic", [
    ("POST", "/v1/nowhere", {}, 404, False),
    ("GET", "/", {}, 404, False),
    ("POST", "/v1/messages/batches", {}, 404, True),
    ("POST", "/v1/files", {"anthropic-version": "2023-06-01"}, 404, True),
    ("GET", "/v1/messages", {}, 405, True),
    ("GET", "/v1/chat/completions", {}, 405, False),
])
def test_unknown_routes_answer_json_in_the_clients_error_shape(live, method, path, headers,
                                                               status, anthropic) -> None:
    base, _ = live
    got, reply = send(base, path, {}, method, headers)
    assert got == status
    if anthropic:
        assert reply["type"] == "error"
        assert reply["error"]["type"] == ("not_found_error" if status == 404
                                          else "invalid_request_error")
    else:
        assert set(reply["error"]) == {"message", "type", "param", "code"}
    message = reply["error"]["message"]
    assert method in message and path in message
    # Control: a route that exists answers.
    assert send(base, "/v1/models", {}, "GET")[0] == 200


def test_serve_clamp_max_tokens_flag(tiny_checkpoints) -> None:
    """`exactdraft serve --clamp-max-tokens`: a max_tokens past the context is lowered to the
    room the prompt leaves, so the reply runs to the context's end (finish reason length)."""
    from tests.server.live import server_process

    with server_process(tiny_checkpoints["llama"], "--backend", "torch",
                        "--clamp-max-tokens") as base:
        status, reply = post(base, "/v1/completions", {"prompt": "abc " * 240,
                                                       "max_tokens": 32000, "temperature": 0})
    assert status == 200, reply
    usage = reply["usage"]
    assert reply["choices"][0]["finish_reason"] == "length"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 1024


@needs_smollm2
@pytest.mark.slow
def test_the_session_on_smollm2_as_the_agent_retries_it(smollm2_server) -> None:
    """The bundled SmolLM2 (context 8192) and the session as the agent runs it: max_tokens
    32000 is answered with the context wording, the retry with a smaller max_tokens streams a
    whole message, and every tool_use it holds has an input object."""
    base, _ = smollm2_server
    retried = 0
    for entry in SESSION:
        status, reply = send(base, entry["path"], entry["body"])
        if status == 400:
            retried += 1
            found = FIT.match(reply["error"]["message"])
            assert found, reply
            size, _, context = (int(g) for g in found.groups())
            retry = {**entry["body"], "max_tokens": min(context - size, 48), "temperature": 0}
            status, reply = send(base, entry["path"], retry)
        assert status == 200, reply
        if not entry["body"].get("stream"):
            continue
        well_formed(reply)
        blocks: dict[int, dict] = {}
        for name, payload in reply:
            if name == "content_block_start":
                blocks[payload["index"]] = {**payload["content_block"], "json": ""}
            elif name == "content_block_delta" and "partial_json" in payload["delta"]:
                blocks[payload["index"]]["json"] += payload["delta"]["partial_json"]
        for block in blocks.values():
            if block["type"] == "tool_use":
                assert isinstance(json.loads(block["json"]), dict), block
    assert retried == len(AGENT)  # the agent's requests, 32000 past the context of 8192
