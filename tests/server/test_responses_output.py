"""The Responses API's output items with reasoning: a Harmony reply that reasons and then
calls gives a reasoning item and a function_call item, the same fed whole or a character at a
time, its events building those very items; without reasoning the one message opens first."""

from __future__ import annotations

from exactdraft.server.reasoning.harmony import HarmonySplitter
from exactdraft.server.responses_output import OutputItems
from exactdraft.server.tool_calls.formats import format_named
from exactdraft.server.tool_calls.requests import ToolRequest

TEXT = ("<|channel|>analysis<|message|>Ask the clock.<|end|><|start|>assistant<|channel|>"
        "commentary to=functions.now <|constrain|>json<|message|>{}<|call|>")
REQUEST = ToolRequest([{"name": "now", "parameters": {"type": "object"}}],
                      format=format_named("harmony"))


def items_of(pieces: list[str], reasoning=HarmonySplitter) -> tuple[list, list]:
    output = OutputItems(REQUEST, "k", reasoning)
    events = output.start()
    for index, piece in enumerate(pieces):
        events += output.feed(piece, index == len(pieces) - 1)
    return output.items, events


def test_reasoning_then_a_call_whole_or_streamed():
    whole, _ = items_of([TEXT])
    assert [item["type"] for item in whole] == ["reasoning", "function_call"]
    assert whole[0]["content"] == [{"type": "reasoning_text", "text": "Ask the clock."}]
    assert (whole[1]["name"], whole[1]["arguments"]) == ("now", "{}")
    streamed, events = items_of(list(TEXT))
    assert streamed == whole
    done = [fields["item"] for kind, fields in events if kind == "response.output_item.done"]
    assert done == whole
    deltas = [fields["delta"] for kind, fields in events
              if kind == "response.reasoning_text.delta"]
    assert "".join(deltas) == "Ask the clock."
    # Negative control: without the reasoning splitter the analysis stays in a message.
    plain, _ = items_of([TEXT], reasoning=None)
    assert [item["type"] for item in plain] == ["message", "function_call"]
    assert "Ask the clock." in plain[0]["content"][0]["text"]
