"""Function tools on /v1/responses.

End to end (SmolLM2, greedy, the generic tools prompt): the official openai client's
`responses.create(tools=...)` gets a `function_call` item whole and streamed, and answers a
`function_call_output` follow-up sent as the whole conversation or through
`previous_response_id`; each prompt is the one /v1/chat/completions renders for the same chat
(the serial Python API's digests for it). The OpenAI Agents SDK's default Responses model runs
its tool loop against the server.

Unit (the output builder fed known model text): in every call format, the stream's events
assemble to the whole response's output items.

The tiny llama server: a named tool_choice forces a call, whole and streamed alike; a second
turn through `previous_response_id` is the same request as the whole conversation sent again;
ids the server does not hold, `store: false` and calls answered by no output are refused by
name.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from exactdraft.server.fields import RequestError
from exactdraft.server.responses_output import OutputItems
from exactdraft.server.responses_store import ResponseStore
from exactdraft.server.tool_calls.formats import format_named
from exactdraft.server.tool_calls.requests import ToolRequest
from tests.conftest import needs_smollm2
from tests.server.conftest import MODEL
from tests.server.live import post
from tests.server.tool_calls.test_requests import (
    FUNCTION,
    TEXTS,
    digests,
    internal,
    openai_history,
    serial_receipt,
)

openai = pytest.importorskip("openai")

TOOLS = [{"type": "function", **FUNCTION}]  # the Responses API's flat form
CHOICE_SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                 "required": ["city"], "additionalProperties": False}
CHOICE_TOOLS = [{"type": "function", "name": "get_weather", "parameters": CHOICE_SCHEMA}]


def response_items(messages: list[dict]) -> list[dict]:
    """Chat-completions messages (openai_history) as Responses input items."""
    items = []
    for message in messages:
        if message["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                          "output": message["content"]})
        elif message.get("tool_calls"):
            items += [{"type": "function_call", "call_id": c["id"],
                       "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                      for c in message["tool_calls"]]
        else:
            items.append({"type": "message", "role": message["role"],
                          "content": message["content"]})
    return items


def assembled(events: list) -> tuple[list[dict], str, dict[str, str]]:
    """(the items as output_item.done gave them, the text deltas, each call's argument
    deltas), checking that every delta names the open item."""
    done, text, arguments, open_item = [], "", {}, None
    for kind, fields in events:
        if kind == "response.output_item.added":
            assert fields["output_index"] == len(done) and open_item is None
            open_item = fields["item"]
            assert open_item["status"] == "in_progress"
        elif kind == "response.output_item.done":
            assert fields["item"]["id"] == open_item["id"]
            done.append(fields["item"])
            open_item = None
        elif kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
            assert (fields["item_id"], fields["output_index"]) == (open_item["id"], len(done))
            if kind == "response.output_text.delta":
                text += fields["delta"]
            else:
                arguments[open_item["id"]] = arguments.get(open_item["id"], "") + \
                    fields["delta"]
    assert open_item is None
    return done, text, arguments


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_the_stream_of_any_format_assembles_to_the_whole_output(name) -> None:
    text = TEXTS[name]
    request = ToolRequest([FUNCTION], format=format_named(name))
    whole = OutputItems(request, "k")
    whole.feed(text, True)
    calls = [i for i in whole.items if i["type"] == "function_call"]
    assert [json.loads(c["arguments"])["city"] for c in calls] == \
        (["Paris", "Oslo"] if name == "hermes" else ["Paris"])
    assert all(c["status"] == "completed" and c["call_id"].startswith("call_k_") for c in calls)
    messages = [i for i in whole.items if i["type"] == "message"]
    assert [m["content"][0]["text"] for m in messages] == \
        (["Checking."] if text.startswith("Checking.") else [])

    streamed = OutputItems(request, "k")
    events = streamed.start()
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    for number, piece in enumerate(pieces):
        events += streamed.feed(piece, number == len(pieces) - 1)
    done, deltas, arguments = assembled(events)
    assert done == streamed.items == whole.items
    assert deltas == "".join(m["content"][0]["text"] for m in messages)
    assert arguments == {c["id"]: c["arguments"] for c in calls}
    # Negative control: without tools the text, markup and all, is one message.
    plain = OutputItems(None, "k")
    plain.feed(text, True)
    assert [i["type"] for i in plain.items] == ["message"]
    assert plain.items[0]["content"][0]["text"] == text


def test_a_call_cut_by_the_length_limit_is_dropped() -> None:
    """As in the chat APIs: no function_call item whose arguments may not parse; the text
    before the call stays. Control: the same call whole is an item."""
    request = ToolRequest([FUNCTION], format=format_named("generic"))
    cut = OutputItems(request, "k")
    events = cut.feed('Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"ci',
                      True, cut=True)
    assert [item["type"] for item in cut.items] == ["message"]
    assert cut.items[0]["content"][0]["text"] == "Let me look."
    assert assembled(events)[0] == cut.items
    whole = OutputItems(request, "k")
    whole.feed('Let me look.\n<tool_call>{"name": "get_weather", "arguments": '
               '{"city": "Oslo"}}</tool_call>', True)
    assert [item["type"] for item in whole.items] == ["message", "function_call"]
    assert whole.items[1]["status"] == "completed"


@pytest.fixture(scope="module")
def client(live):
    base, _ = live
    return openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


# The tiny random model's greedy arguments are whitespace without end; this seed's draw closes
# the call within the limit.
NAMED = dict(model=MODEL, input="weather?", tools=CHOICE_TOOLS, parallel_tool_calls=False,
             tool_choice={"type": "function", "name": "get_weather"}, temperature=1,
             max_output_tokens=200, extra_body={"seed": 1})


def test_a_named_tool_choice_forces_a_call_whole_and_streamed(client) -> None:
    whole = client.responses.create(**NAMED)
    assert whole.status == "completed"
    (call,) = whole.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.status == "completed" and json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    assert whole.tool_choice.name == "get_weather" and whole.tools[0].name == "get_weather"

    events = list(client.responses.create(stream=True, **NAMED))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress",
                         "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done",
                          "response.completed"]
    added, done, final = events[2], events[-2], events[-1].response
    assert added.item.type == "function_call" and added.item.status == "in_progress"
    assert "".join(e.delta for e in events if e.type ==
                   "response.function_call_arguments.delta") == call.arguments
    assert all(e.item_id == added.item.id and e.output_index == 0 for e in events
               if e.type.startswith("response.function_call_arguments"))
    assert done.item == final.output[0]
    assert (final.output[0].name, final.output[0].arguments) == (call.name, call.arguments)
    assert final.model_extra["receipt"]["token_ids_sha256"] == \
        whole.model_extra["receipt"]["token_ids_sha256"]


def test_previous_response_id_continues_the_stored_conversation(client) -> None:
    first = client.responses.create(instructions="be brief", **NAMED)
    (call,) = first.output
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "rainy"}
    again = dict(model=MODEL, tools=CHOICE_TOOLS, temperature=0, max_output_tokens=12)
    chained = client.responses.create(previous_response_id=first.id, input=[result], **again)
    whole = client.responses.create(input=[
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments}, result], **again)
    assert chained.previous_response_id == first.id
    assert digests(chained.model_extra["receipt"]) == digests(whole.model_extra["receipt"])
    assert chained.output_text == whole.output_text
    # Negative control: instructions are not inherited, so sending them is another prompt.
    instructed = client.responses.create(previous_response_id=first.id, input=[result],
                                         instructions="be brief", **again)
    assert instructed.model_extra["receipt"]["prompt_ids_sha256"] != \
        chained.model_extra["receipt"]["prompt_ids_sha256"]
    # the chained response is stored in turn: a third turn continues from it
    third = client.responses.create(previous_response_id=chained.id, input="thanks", **again)
    assert third.status in ("completed", "incomplete")


def test_ids_not_held_and_unanswered_calls_are_refused(live, client) -> None:
    base, _ = live
    unstored = client.responses.create(store=False, **NAMED)
    assert unstored.store is False
    for missing in (unstored.id, "resp_unknown"):
        status, reply = post(base, "/v1/responses", {"previous_response_id": missing,
                                                     "input": "more"})
        assert status == 400 and reply["error"]["param"] == "previous_response_id"
        assert "not held" in reply["error"]["message"]
    stored = client.responses.create(**NAMED)
    status, reply = post(base, "/v1/responses", {"previous_response_id": stored.id, "input": [
        {"type": "function_call_output", "call_id": "call_other", "output": "x"}]})
    assert status == 400 and reply["error"]["param"] == "input[0].call_id"
    status, _ = post(base, "/v1/responses", {"previous_response_id": stored.id, "input": [
        {"type": "function_call_output", "call_id": stored.output[0].call_id, "output": "x"}],
        "max_output_tokens": 2})
    assert status == 200


def test_the_store_keeps_the_newest_conversations() -> None:
    store = ResponseStore(capacity=2)
    for number in range(3):
        store.keep(f"resp_{number}", [{"role": "user", "content": str(number)}])
    with pytest.raises(RequestError, match="resp_0") as refused:
        store.conversation("resp_0")
    assert refused.value.param == "previous_response_id"
    held = store.conversation("resp_2")
    held.append({"role": "user", "content": "changed"})  # a copy: the store is unchanged
    assert store.conversation("resp_2") == [{"role": "user", "content": "2"}]
    assert store.conversation("resp_1") == [{"role": "user", "content": "1"}]


@pytest.mark.parametrize("fields, param", [
    (dict(tools=[{"type": "function"}]), "tools[0].name"),
    (dict(tools=[{"type": "function", "name": "f", "parameters": "x"}]), "tools[0].parameters"),
    (dict(tools=[{"type": "function", "name": "f", "strict": "yes"}]), "tools[0].strict"),
    (dict(tools=[{"type": "function", "name": "f"}] * 2), "tools[1]"),
    (dict(tools="f"), "tools"),
    (dict(tools=CHOICE_TOOLS, tool_choice={"type": "function", "name": "g"}), "tool_choice"),
    (dict(tools=CHOICE_TOOLS, tool_choice={"type": "allowed_tools"}), "tool_choice"),
    (dict(tools=CHOICE_TOOLS, tool_choice="sometimes"), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]),
     "input[0].arguments"),
    (dict(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]),
     "input[0].arguments"),
    (dict(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
     "input[0].call_id"),
    (dict(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                 {"type": "function_call_output", "call_id": "c", "output": [{"x": 1}]}]),
     "input[1].output[0]"),
])
def test_bad_tools_and_items_name_the_field(live, fields, param) -> None:
    base, _ = live
    status, reply = post(base, "/v1/responses", {"model": MODEL, "input": "abc", **fields})
    assert status == 400 and reply["error"]["param"] == param, reply


@needs_smollm2
def test_a_tool_call_and_its_answer_through_the_openai_client(smollm2_server) -> None:
    base, generator = smollm2_server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    messages = openai_history("What is the weather in Paris?")
    options = dict(model="smollm2", tools=TOOLS, temperature=0, max_output_tokens=40)
    whole = client.responses.create(input=response_items(messages), **options)
    (call,) = whole.output
    assert whole.status == "completed" and call.type == "function_call"
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    # the prompt and tokens of /v1/chat/completions for the same chat (test_tools.py)
    assert digests(whole.model_extra["receipt"]) == \
        serial_receipt(generator, internal(messages), 40)
    events = list(client.responses.create(input=response_items(messages), stream=True,
                                          **options))
    assert all("<tool_call>" not in getattr(e, "delta", "") for e in events)
    final = events[-1].response
    assert [(i.type, i.name, i.arguments) for i in final.output] == \
        [(call.type, call.name, call.arguments)]

    result = {"type": "function_call_output", "call_id": call.call_id, "output": "rainy, 12 C"}
    answer = client.responses.create(
        input=[*response_items(messages), call.model_dump(exclude_none=True), result],
        **options)
    assert answer.status == "completed" and [i.type for i in answer.output] == ["message"]
    assert "Paris" in answer.output_text and "<tool" not in answer.output_text
    follow_up = [*messages, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function",
         "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "rainy, 12 C"}]
    assert digests(answer.model_extra["receipt"]) == \
        serial_receipt(generator, internal(follow_up), 40)
    chained = client.responses.create(previous_response_id=whole.id, input=[result], **options)
    assert chained.output_text == answer.output_text


@needs_smollm2
def test_the_agents_sdk_runs_its_tool_loop(smollm2_server) -> None:
    """An Agent with one function tool on the SDK's default OpenAIResponsesModel, run whole and
    streamed: the call is forced on the first turn (tool_choice required; the SDK then resets
    it to auto), the tool runs, and the final answer is the server's answer to the
    conversation so far asked directly."""
    import asyncio

    agents = pytest.importorskip("agents")
    base, _ = smollm2_server
    agents.set_tracing_disabled(True)
    called = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        called.append(city)
        return "rainy, 12 C"

    instructions, question = "Answer questions about the weather.", "What is the weather in Paris?"

    async def run() -> tuple[Any, Any, list[str]]:
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        settings = agents.ModelSettings(temperature=0, max_tokens=200, tool_choice="required",
                                        parallel_tool_calls=False)
        agent = agents.Agent(name="weather", instructions=instructions, tools=[get_weather],
                             model_settings=settings,
                             model=agents.OpenAIResponsesModel("smollm2", openai_client=client))
        whole = await agents.Runner.run(agent, question)
        streamed = agents.Runner.run_streamed(agent, question)
        kinds = [event.data.type async for event in streamed.stream_events()
                 if event.type == "raw_response_event"]
        return whole, streamed, kinds

    whole, streamed, kinds = asyncio.run(run())
    assert called == ["Paris", "Paris"]
    assert {"response.function_call_arguments.delta", "response.output_text.delta"} <= set(kinds)
    direct = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    tool = {"type": "function", "name": "get_weather", "description": get_weather.description,
            "parameters": get_weather.params_json_schema, "strict": True}
    for result in (whole, streamed):
        first, last = result.raw_responses
        call = first.output[0]
        assert call.type == "function_call" and last.output[0].type == "message"
        answer = direct.responses.create(
            model="smollm2", instructions=instructions, tools=[tool], parallel_tool_calls=False,
            temperature=0, max_output_tokens=200,
            input=[{"role": "user", "content": question}, call.model_dump(exclude_none=True),
                   {"type": "function_call_output", "call_id": call.call_id,
                    "output": "rainy, 12 C"}])
        assert isinstance(result.final_output, str) and result.final_output
        assert result.final_output == answer.output_text
