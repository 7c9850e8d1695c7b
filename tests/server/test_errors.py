"""Refused requests against a live server: every bad request (bad bytes, bad JSON, a model
name that is not a string, a field out of range or of the wrong type, a prompt or max_tokens
beyond the context) gets a 400 JSON error in its API's wire format naming the offending field,
and the server answers a good request right after each one."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.server.conftest import MODEL
from tests.server.live import post

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"
USER = [{"role": "user", "content": "abc abc"}]
LONG = "abc " * 300  # 1200 characters: more tokens than the tiny model's context of 1024
GOOD = {CHAT: {"model": MODEL, "messages": USER, "max_tokens": 2},
        COMPLETIONS: {"model": MODEL, "prompt": "abc", "max_tokens": 2},
        MESSAGES: {"model": MODEL, "messages": USER, "max_tokens": 2}}


def changed(path: str, **fields: Any) -> dict[str, Any]:
    """The good request of `path` with `fields` replaced (a value of None removes the field)."""
    body = {**GOOD[path], **fields}
    return {name: value for name, value in body.items() if value is not None}


def raw(path: str, text: str) -> bytes:
    """The good request of `path` with `text` spliced in as extra raw JSON members."""
    return json.dumps(GOOD[path]).encode()[:-1] + b", " + text.encode() + b"}"


BODIES = [(b"{\"model\": ", "body"), (b"", "body"), (b"[1, 2]", "body"), (b"null", "body"),
          (b"\"text\"", "body"), (b"[" * 100_000 + b"]" * 100_000, "body"),
          (b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}", "body")]

SHARED = [  # (fields, the param named) for every route
    (dict(model=5), "model"),
    (dict(max_tokens=-1), "max_tokens"),
    (dict(max_tokens=10**9), "max_tokens"),
    (dict(max_tokens=1024), "max_tokens"),  # the whole context: no room for the prompt
    (dict(max_tokens="5"), "max_tokens"),
    (dict(max_tokens=2.5), "max_tokens"),
    (dict(top_p=2), "top_p"),
    (dict(top_p="high"), "top_p"),
    (dict(temperature=-1), "temperature"),
    (dict(temperature=[1]), "temperature"),
    (dict(top_k=-3), "top_k"),
    (dict(seed=-1), "seed"),
    (dict(seed=2**70), "seed"),
    (dict(seed="x"), "seed"),
    (dict(stream="yes"), "stream"),
    (dict(drafts="no"), "drafts"),
]
CHAT_ONLY = [
    (dict(messages=None), "messages"),
    (dict(messages="hi"), "messages"),
    (dict(messages=[]), "messages"),
    (dict(messages=["hi"]), "messages[0]"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role"),
    (dict(messages=[*USER, {"content": "hi"}]), "messages[1].role"),
    (dict(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (dict(messages=[{"role": "user", "content": [{"type": "image"}]}]),
     "messages[0].content[0]"),
    (dict(messages=[{"role": "user", "content": LONG}]), "messages"),
]
OPENAI_ONLY = [
    (dict(max_completion_tokens=-1), "max_completion_tokens"),
    (dict(n=0), "n"),
    (dict(n=100), "n"),
    (dict(n="2"), "n"),
    (dict(stop=5), "stop"),
    (dict(stop=[""]), "stop"),
    (dict(logit_bias=[1]), "logit_bias"),
    (dict(logit_bias={"x": 1}), "logit_bias"),
    (dict(logit_bias={"5": "big"}), "logit_bias"),
    (dict(logit_bias={"5000": 1}), "logit_bias"),  # beyond the vocabulary of 128
    (dict(logit_bias={"-1": 1}), "logit_bias"),
    (dict(presence_penalty="x"), "presence_penalty"),
    (dict(stream_options="x"), "stream_options"),
    (dict(response_format={"type": "xml"}), "response_format.type"),
]
MESSAGES_ONLY = [
    (dict(max_tokens=None), "max_tokens"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(messages=[{"role": "system", "content": "hi"}]), "messages"),  # no turn left
    (dict(messages=[{"role": "system", "content": 5}, *USER]), "messages[0].content"),
    (dict(messages=[*USER, {"role": "developer", "content": "hi"}]), "messages[1].role"),
    (dict(system=5), "system"),
    (dict(stop_sequences=5), "stop_sequences"),
]
CASES = (
    [(path, body, param) for path in GOOD for body, param in BODIES]
    + [(path, changed(path, **fields), param) for path in GOOD for fields, param in SHARED]
    + [(path, changed(path, **fields), param) for path in (CHAT, MESSAGES)
       for fields, param in CHAT_ONLY]
    + [(path, changed(path, **fields), param) for path in (CHAT, COMPLETIONS)
       for fields, param in OPENAI_ONLY]
    + [(MESSAGES, changed(MESSAGES, **fields), param) for fields, param in MESSAGES_ONLY]
    + [(path, raw(path, '"seed": ' + "9" * 5000), "body") for path in GOOD]
    + [(path, changed(path, stream=True, top_p=2), "top_p") for path in GOOD]
    + [(CHAT, raw(CHAT, '"temperature": NaN'), "temperature"),
       (CHAT, raw(CHAT, '"max_tokens": 1e400'), "max_tokens"),
       (MESSAGES, raw(MESSAGES, '"top_p": Infinity'), "top_p"),
       (CHAT, changed(CHAT, messages=[{"role": "user", "content": "a\ud800"}]),
        "messages[0].content"),
       (MESSAGES, changed(MESSAGES, system=[{"type": "text", "text": "\udfff"}]), "system"),
       (COMPLETIONS, changed(COMPLETIONS, prompt="\ud800"), "prompt"),
       (CHAT, changed(CHAT, stop=["a\ud800"]), "stop"),
       (MESSAGES, changed(MESSAGES, stop_sequences=["\udfff"]), "stop_sequences"),
       (CHAT, changed(CHAT, logprobs="yes"), "logprobs"),
       (CHAT, changed(CHAT, top_logprobs=3), "top_logprobs"),
       (CHAT, changed(CHAT, logprobs=True, top_logprobs=50), "top_logprobs"),
       (COMPLETIONS, changed(COMPLETIONS, logprobs=50), "logprobs"),
       (COMPLETIONS, changed(COMPLETIONS, tools=[{"name": "f"}]), "tools"),
       (COMPLETIONS, changed(COMPLETIONS, prompt=None), "prompt"),
       (COMPLETIONS, changed(COMPLETIONS, prompt=[]), "prompt"),
       (COMPLETIONS, changed(COMPLETIONS, prompt=[1, 5000]), "prompt"),
       (COMPLETIONS, changed(COMPLETIONS, prompt=LONG), "prompt"),
       (COMPLETIONS, changed(COMPLETIONS, prompt=["a", 5]), "prompt[1]"),
       (COMPLETIONS, changed(COMPLETIONS, prompt=[[1, 2], []]), "prompt[1]"),
       (COMPLETIONS, changed(COMPLETIONS, prompt=["a", [1, 5000]]), "prompt"),
       (COMPLETIONS, changed(COMPLETIONS, prompt=["a"] * 129), "prompt"),
       (COMPLETIONS, changed(COMPLETIONS, echo="yes"), "echo")]
)


def error_of(path: str, reply: Any) -> dict[str, Any]:
    """The error object of a refusal, checked to be in the wire format of `path`'s API."""
    assert isinstance(reply, dict) and isinstance(reply.get("error"), dict), reply
    if path == MESSAGES:
        assert reply["type"] == "error"
    assert isinstance(reply["error"]["message"], str) and reply["error"]["message"]
    return reply["error"]


@pytest.mark.parametrize("path, body, param", CASES,
                         ids=[f"{p[4:].replace('/', '.')}-{i}-{n}" for i, (p, _, n) in
                              enumerate(CASES)])
def test_a_bad_request_is_refused_by_name_and_the_server_goes_on(live, path: str, body: Any,
                                                                 param: str) -> None:
    """A 400 JSON error naming `param`, then a good request answered 200."""
    base, _ = live
    status, reply = post(base, path, body)
    assert status == 400, reply
    assert error_of(path, reply)["param"] == param, reply
    status, reply = post(base, path, GOOD[path])
    assert status == 200, reply

