"""Histories with tool calls: reasoning given back beside calls reaches the chat messages (an
Anthropic thinking block through anthropic_api.thinking_apart, an OpenAI reasoning_content),
and what is malformed is refused naming the field."""

from __future__ import annotations

import pytest

from exactdraft.server.anthropic_api import thinking_apart
from exactdraft.server.fields import RequestError
from exactdraft.server.tool_calls.histories import anthropic_history, openai_history

KEY = b"k" * 32  # the server's thinking key; the blocks' "s" is not its signature
CALL = {"id": "t1", "type": "function", "function": {"name": "now", "arguments": "{}"}}


def test_anthropic_thinking_beside_a_call_is_the_reasoning_of_that_message():
    messages = [{"role": "user", "content": "Time?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Ask ", "signature": "s"},
                    {"type": "redacted_thinking", "data": "x"},
                    {"type": "thinking", "thinking": "the clock.", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "now", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                              "content": "noon"}]}]
    history = anthropic_history(thinking_apart(messages, KEY), None)
    assert history[1] == {"role": "assistant", "content": "",
                          "tool_calls": [{**CALL, "function": {"name": "now",
                                                               "arguments": {}}}],
                          "reasoning_content": "Ask the clock."}
    assert history[2]["role"] == "tool" and "reasoning_content" not in history[2]
    # The control: the blocks read without thinking_apart are refused, so the test above
    # depends on it.
    with pytest.raises(RequestError, match=r"messages\[1\]\.content\[0\]\.type"):
        anthropic_history(messages, None)


def test_openai_reasoning_beside_calls_is_kept_and_checked():
    messages = [{"role": "user", "content": "Time?"},
                {"role": "assistant", "content": None, "tool_calls": [CALL],
                 "reasoning_content": "Ask the clock."},
                {"role": "tool", "tool_call_id": "t1", "content": "noon"}]
    history = openai_history(messages)
    assert history[1]["reasoning_content"] == "Ask the clock."
    assert history[1]["tool_calls"][0]["function"] == {"name": "now", "arguments": {}}
    messages[1]["reasoning_content"] = ["not", "text"]
    with pytest.raises(RequestError) as refused:
        openai_history(messages)
    assert refused.value.param == "messages[1].reasoning_content"


def test_thinking_outside_an_assistant_message_is_refused_by_name():
    messages = [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}]
    with pytest.raises(RequestError) as refused:
        anthropic_history(thinking_apart(messages, KEY), None)
    assert refused.value.param == "messages[0].content[0].type"
