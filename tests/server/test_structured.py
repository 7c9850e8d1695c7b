"""Structured output through the server on the bundled SmolLM2: OpenAI's response_format (the
official client's `parse` with a pydantic model), the `constraint` extension, and tool calls whose
arguments a required tool_choice constrains, in both APIs; drafted == serial through the
server; bad constraints refused by name while the server keeps serving."""

from __future__ import annotations

import json

import pytest

from tests.conftest import needs_smollm2
from tests.server.live import post

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pydantic = pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

FORECAST = {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "days": {"type": "integer", "minimum": 1, "maximum": 14},
                           "units": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "days", "units"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_forecast",
                                           "description": "The weather forecast of a city",
                                           "parameters": FORECAST}}]
ANTHROPIC_TOOLS = [{"name": "get_forecast", "description": "The weather forecast of a city",
                    "input_schema": FORECAST}]
ASK = [{"role": "user", "content": "I need the 5-day forecast for Bergen in celsius."}]


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=20)
    age: int
    city: str = pydantic.Field(max_length=20)


@needs_smollm2
def test_openai_parse_with_a_pydantic_model(smollm2_server):
    base, _ = smollm2_server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Ada is 36 and lives in Oslo. Describe her."}]
    for seed in range(3):
        completion = client.chat.completions.parse(
            model="smollm2", messages=messages, response_format=Person, temperature=0.8,
            seed=seed, max_tokens=80)
        person = completion.choices[0].message.parsed
        assert isinstance(person, Person), completion.choices[0].message.content
    serial = client.chat.completions.parse(model="smollm2", messages=messages,
                                           response_format=Person, temperature=0.8, seed=2,
                                           max_tokens=80, extra_body={"drafts": False})
    assert serial.choices[0].message.content == completion.choices[0].message.content
    assert serial.choices[0].model_extra["receipt"]["token_ids_sha256"] == \
        completion.choices[0].model_extra["receipt"]["token_ids_sha256"]


@needs_smollm2
def test_the_constraint_extension_in_both_apis(smollm2_server):
    base, _ = smollm2_server
    body = {"model": "smollm2", "max_tokens": 12, "temperature": 0.7, "seed": 3,
            "messages": [{"role": "user", "content": "Which city is the capital of Norway?"}],
            "constraint": {"choices": ["Oslo", "Bergen", "Trondheim"]}}
    status, reply = post(base, "/v1/chat/completions", body)
    assert status == 200, reply
    assert reply["choices"][0]["message"]["content"] in ("Oslo", "Bergen", "Trondheim")
    status, message = post(base, "/v1/messages",
                           {**body, "constraint": {"regex": "[A-Z][a-z]+ is the capital\\."}})
    assert status == 200, message
    text = message["content"][0]["text"]
    assert text.endswith(" is the capital.") and text[0].isupper()


@needs_smollm2
def test_a_required_tool_choice_gives_calls_that_validate(smollm2_server):
    base, _ = smollm2_server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    for seed in range(3):
        whole = client.chat.completions.create(
            model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False, temperature=0.8, seed=seed, max_tokens=120)
        choice = whole.choices[0]
        assert choice.finish_reason == "tool_calls", choice.message
        for call in choice.message.tool_calls:
            assert call.function.name == "get_forecast"
            jsonschema.validate(json.loads(call.function.arguments), FORECAST)
    chunks = list(client.chat.completions.create(
        model="smollm2", messages=ASK, tools=TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=0.8, seed=seed, max_tokens=120, stream=True))
    pieces = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    arguments = "".join(p.function.arguments or "" for p in pieces)
    assert arguments == choice.message.tool_calls[0].function.arguments

    claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    message = claude.messages.create(model="claude-any", messages=ASK, tools=ANTHROPIC_TOOLS,
                                     tool_choice={"type": "any",
                                                  "disable_parallel_tool_use": True},
                                     max_tokens=120)
    assert message.stop_reason == "tool_use"
    (use,) = [block for block in message.content if block.type == "tool_use"]
    jsonschema.validate(use.input, FORECAST)


@needs_smollm2
@pytest.mark.parametrize("body, param", [
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"constraint": {"regex": "a{3}b{"}}, "constraint.regex"),
    ({"constraint": {"grammar": "start: missing_rule"}}, "constraint.grammar"),
    ({"constraint": {"choices": []}}, "constraint.choices"),
    ({"constraint": {"sql": "select"}}, "constraint"),
    ({"constraint": {"regex": "a"}, "response_format": {"type": "json_object"}},
     "constraint.regex"),
])
def test_bad_constraints_are_refused_by_name_and_the_server_goes_on(smollm2_server, body,
                                                                     param):
    base, _ = smollm2_server
    request = {"model": "smollm2", "max_tokens": 4,
               "messages": [{"role": "user", "content": "Hi"}], **body}
    status, reply = post(base, "/v1/chat/completions", request)
    assert status == 400, reply
    assert reply["error"]["param"] == param, reply
    status, reply = post(base, "/v1/chat/completions",
                         {**request, "response_format": None, "constraint": None})
    assert status == 200, reply
