"""The OpenAI Responses API through the official client: text and message input, whole and
streamed, each equal to the serial Python API's answer to the same chat; refusals of what the
server cannot do name the field (tools and previous_response_id: test_responses_tools.py)."""

from __future__ import annotations

import pytest

from exactdraft.results import token_digest
from tests.server.conftest import MODEL
from tests.server.live import post

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(live):
    base, _ = live
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def serial(generator, messages, **options):
    return generator.generate(messages, drafts=False, **options)


def test_text_input_with_instructions(client, served_generator) -> None:
    reply = client.responses.create(model=MODEL, input="abc abc abc", instructions="be brief",
                                    max_output_tokens=16,
                                    extra_body={"temperature": 0.8, "seed": 5,
                                                "top_k": 40})
    alone = serial(served_generator, [{"role": "system", "content": "be brief"},
                                      {"role": "user", "content": "abc abc abc"}],
                   max_new_tokens=16, temperature=0.8, seed=5, top_k=40)
    assert reply.output_text == alone.text and reply.instructions == "be brief"
    assert reply.model_extra["receipt"]["token_ids_sha256"] == token_digest(alone.tokens)
    assert reply.usage.output_tokens == len(alone.tokens)
    assert reply.usage.input_tokens == len(alone.prompt_tokens)
    assert reply.status == ("incomplete" if alone.finish_reason == "length" else "completed")
    if reply.status == "incomplete":
        assert reply.incomplete_details.reason == "max_output_tokens"


def test_message_items_streamed_equal_whole(client, served_generator) -> None:
    conversation = [
        {"role": "developer", "content": "answer in lowercase"},
        {"role": "user", "content": [{"type": "input_text", "text": "abc "},
                                     {"type": "input_text", "text": "abc"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "abc"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"role": "user", "content": "again"}]
    options = dict(model=MODEL, input=conversation, max_output_tokens=20, temperature=0.9,
                   extra_body={"seed": 8, "logit_bias_ignored": 1})
    whole = client.responses.create(**options)
    alone = serial(served_generator, [
        {"role": "system", "content": "answer in lowercase"},
        {"role": "user", "content": "abc abc"}, {"role": "assistant", "content": "abc"},
        {"role": "user", "content": "again"}], max_new_tokens=20, temperature=0.9, seed=8)
    assert whole.output_text == alone.text
    events = list(client.responses.create(stream=True, **options))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text
    assert final.model_extra["receipt"]["token_ids_sha256"] == \
        whole.model_extra["receipt"]["token_ids_sha256"]
    with client.responses.stream(**options) as stream:  # the client's streaming helper
        helped = [e for e in stream]
    assert "".join(e.delta for e in helped if e.type == "response.output_text.delta") == \
        whole.output_text
    assert helped[-1].type == kinds[-1]


@pytest.mark.parametrize("fields, param", [
    (dict(previous_response_id="resp_1"), "previous_response_id"),
    (dict(conversation="conv_1"), "conversation"),
    (dict(tools=[{"type": "web_search"}]), "tools[0].type"),
    (dict(text={"format": {"type": "json_object"}}), "text.format"),
    (dict(input=[]), "input"),
    (dict(input=[{"role": "user", "content": [{"type": "input_image"}]}]),
     "input[0].content[0]"),
    (dict(input=[{"type": "function_call_output", "output": "x"}]), "input[0].call_id"),
    (dict(input=[{"type": "item_reference", "id": "x"}]), "input[0].type"),
    (dict(input=[{"role": "wizard", "content": "x"}]), "input[0].role"),
    (dict(max_output_tokens=0), "max_output_tokens"),
    (dict(temperature=-1), "temperature"),
])
def test_refusals_name_the_field(live, fields, param) -> None:
    base, _ = live
    status, reply = post(base, "/v1/responses", {"model": MODEL, "input": "abc", **fields})
    assert status == 400 and reply["error"]["param"] == param, reply
    assert post(base, "/v1/responses", {"model": MODEL, "input": "abc",
                                        "max_output_tokens": 2})[0] == 200
