"""Constraints llguidance cannot follow, or too big to compile, are refused before any token
(a 400 naming the field, streamed or not): an object of 600 optional integers (a parser row
past llguidance's 2000 items), a regex past the lexer's budget, a schema over
MAX_CONSTRAINT_BYTES, a tool whose schema is the 600 optional integers. Building runs off the
event loop (/health answers meanwhile), and the same schema sent twice is built and compiled
once."""

from __future__ import annotations

import json
import secrets
import threading
import time
import types
import urllib.request
from typing import Any

import pytest

from tests.conftest import needs_smollm2
from tests.server.live import post

pytest.importorskip("llguidance")

from exactdraft.server.fields import MAX_CONSTRAINT_BYTES  # noqa: E402

ASK = [{"role": "user", "content": "Hi"}]
OPTIONAL_INTEGERS = {"type": "object",
                     "properties": {f"p{i}": {"type": "integer"} for i in range(600)}}
HUGE = {"type": "object", "properties": {f"property_number_{i}": {
    "type": "string", "description": "d" * 960} for i in range(5000)}}  # about 5 MB
TOOL = [{"type": "function", "function": {"name": "many", "parameters": OPTIONAL_INTEGERS}}]
HEALTH_BOUND_S = 0.2


def response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema}}}


def required_strings(count: int, prefix: str) -> dict[str, Any]:
    names = [f"{prefix}_{i}" for i in range(count)]
    return {"type": "object", "properties": {name: {"type": "string"} for name in names},
            "required": names}


def largest_allowed(prefix: str) -> dict[str, Any]:
    """An object of required string properties, as many as fit in MAX_CONSTRAINT_BYTES."""
    low, high = 1, MAX_CONSTRAINT_BYTES
    while low < high:  # the most properties whose schema fits
        middle = (low + high + 1) // 2
        if len(json.dumps(required_strings(middle, prefix)).encode()) <= MAX_CONSTRAINT_BYTES:
            low = middle
        else:
            high = middle - 1
    return required_strings(low, prefix)


@needs_smollm2
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("extra, param, says", [
    (response_format(OPTIONAL_INTEGERS), "response_format", "max is 2000"),
    ({"constraint": {"regex": "a{1000000000}"}}, "constraint.regex",
     "too many expressions"),
    (response_format(HUGE), "response_format", "MAX_CONSTRAINT_BYTES"),
    ({"tools": TOOL, "tool_choice": "required"}, "tools[0].function.parameters", "max is 2000"),
])
def test_a_constraint_that_would_fail_at_the_first_token_is_refused_by_name(
        smollm2_server, stream, extra, param, says):
    base, _ = smollm2_server
    body = {"model": "smollm2", "max_tokens": 4, "messages": ASK, "stream": stream, **extra}
    status, reply = post(base, "/v1/chat/completions", body)
    assert status == 400, reply
    assert reply["error"]["param"] == param, reply
    assert says in reply["error"]["message"], reply
    status, reply = post(base, "/v1/chat/completions",
                         {"model": "smollm2", "max_tokens": 2, "messages": ASK})
    assert status == 200, reply


@needs_smollm2
def test_anthropic_names_the_tool_whose_schema_cannot_be_followed(smollm2_server):
    base, _ = smollm2_server
    body = {"model": "smollm2", "max_tokens": 4, "messages": ASK,
            "tools": [{"name": "fine", "input_schema": {"type": "object"}},
                      {"name": "many", "input_schema": OPTIONAL_INTEGERS}],
            "tool_choice": {"type": "any"}}
    status, reply = post(base, "/v1/messages", body)
    assert status == 400 and reply["error"]["param"] == "tools[1].input_schema", reply


def health_seconds(base: str) -> tuple[float, bool]:
    """(seconds /health took, whether the engine held no request then)."""
    started = time.perf_counter()
    with urllib.request.urlopen(base + "/health", timeout=60) as response:
        health = json.loads(response.read())
    return time.perf_counter() - started, health["running"] + health["waiting"] == 0


@needs_smollm2
def test_health_answers_while_the_largest_allowed_schema_compiles(smollm2_server):
    from exactdraft.constraints import Constraint

    base, generator = smollm2_server
    started = time.perf_counter()  # the premise, on a schema of the same size no one sent
    Constraint.json_schema(largest_allowed(f"premise_{secrets.token_hex(4)}")) \
        .compile_for(generator.tokenizer)
    compile_s = time.perf_counter() - started
    if compile_s < 5 * HEALTH_BOUND_S:
        pytest.skip(f"the largest allowed schema compiles in {compile_s:.2f} s here, not much "
                    f"longer than the {HEALTH_BOUND_S} s bound: nothing to show")
    body = {"model": "smollm2", "max_tokens": 1, "messages": ASK,
            **response_format(largest_allowed(f"sent_{secrets.token_hex(4)}"))}
    replies: list[Any] = []
    request = threading.Thread(target=lambda: replies.append(
        post(base, "/v1/chat/completions", body)))
    request.start()
    time.sleep(0.1)  # the body is sent and the compile under way
    latencies = []  # while the request is not yet in the engine: its constraint compiles
    while request.is_alive():
        seconds, compiling = health_seconds(base)
        if compiling and request.is_alive():
            latencies.append(seconds)
        time.sleep(0.02)
    request.join()
    assert replies[0][0] == 200, replies[0]
    assert len(latencies) >= 3, f"answered {latencies} only (compile {compile_s:.2f} s)"
    assert max(latencies) < HEALTH_BOUND_S, (sorted(latencies)[-5:], compile_s)


class CountedMatcher:
    """llguidance.LLMatcher, counting schema conversions and compiles for a tokenizer."""

    def __init__(self, real: Any, counts: dict[str, int]) -> None:
        self.real, self.counts = real, counts

    def __getattr__(self, name: str) -> Any:
        if name == "grammar_from_json_schema":
            self.counts["built"] += 1
        return getattr(self.real, name)

    def __call__(self, *args: Any, **options: Any) -> Any:
        self.counts["compiled"] += 1
        return self.real(*args, **options)


@needs_smollm2
def test_a_repeated_schema_is_built_and_compiled_once(smollm2_server, monkeypatch):
    import llguidance

    from exactdraft.constraints import constraint as constraints
    from exactdraft.constraints import tokens as constraint_tokens

    counts = {"built": 0, "compiled": 0}
    module = types.SimpleNamespace(LLMatcher=CountedMatcher(llguidance.LLMatcher, counts),
                                   LLTokenizer=llguidance.LLTokenizer)
    monkeypatch.setattr(constraints, "llguidance_module", lambda: module)
    monkeypatch.setattr(constraint_tokens, "llguidance_module", lambda: module)
    base, _ = smollm2_server
    schema = required_strings(3, f"turn_{secrets.token_hex(4)}")
    body = {"model": "smollm2", "max_tokens": 4, "messages": ASK, **response_format(schema)}
    assert post(base, "/v1/chat/completions", body)[0] == 200
    # Built once (its byte-vocabulary check is one matcher), compiled once for the tokenizer.
    assert counts == {"built": 1, "compiled": 2}, counts
    for _ in range(2):
        assert post(base, "/v1/chat/completions", body)[0] == 200
    assert counts == {"built": 1, "compiled": 2}, counts
