"""What the server guide and troubleshooting page say the server refuses is what it refuses, and
what they say it serves (response_format, echo, tools) it serves: the pages are read as data,
so a field added to or dropped from a refusal list fails here until the page says so too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exactdraft.server import anthropic_api, openai_api
from tests.server.conftest import MODEL
from tests.server.live import post

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide"


def names(text: str) -> list[str]:
    return re.findall(r"`([a-z_]+)`", text)


def test_the_guides_refusal_lists_are_the_servers():
    server = (GUIDE / "server.md").read_text()
    refused = re.search(r"Refused with 400 when set \([^)]*\): (.*?)\.", server, re.S)[1]
    assert names(refused) == list(openai_api.UNSUPPORTED)
    refused_anthropic = re.search(r"Refused when set: (.*?)\.", server, re.S)[1]
    assert names(refused_anthropic) == list(anthropic_api.UNSUPPORTED)
    trouble = (GUIDE / "troubleshooting.md").read_text()
    paragraph = re.search(r"is not supported by this server`\*\* \((.*?)\):", trouble, re.S)[1]
    openai_part, anthropic_part = paragraph.split("; Anthropic ")
    assert names(openai_part) == list(openai_api.UNSUPPORTED)
    assert names(anthropic_part.split(";")[0]) == list(anthropic_api.UNSUPPORTED)


def test_the_refusal_check_can_fail():
    """Negative control: a page listing one field too many does not match the server."""
    assert names("`functions`, `function_call`, `audio`, `suffix`, `echo`") != \
        list(openai_api.UNSUPPORTED)


SERVED = [
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}),
    ("/v1/completions", {"echo": True, "logprobs": 1}),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {
        "name": "lookup", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}}}}}]}),
]


@pytest.mark.parametrize("path, fields", SERVED, ids=["response_format", "echo", "tools"])
def test_what_the_guide_says_is_served_is_served(live, path, fields):
    pytest.importorskip("llguidance")
    base, _ = live
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, **fields}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "x"}]
    else:
        body["prompt"] = "x y"
    status, reply = post(base, path, body)
    assert status == 200, reply
    server = (GUIDE / "server.md").read_text()
    assert re.search(f"`{next(iter(fields))}[`:]", server)
