"""A Responses API request as a chat: its `input` items (messages, function calls and their
outputs) as chat-completions messages, and its `tools` and `tool_choice` as the ToolRequest
server/tool_calls/requests.py builds for /v1/chat/completions.

Invariant: every item and tool is checked here and a bad one is refused with a RequestError
naming the field as the client wrote it (`input[2].call_id`, `tools[0].name`); what is handed
on is in the form chat completions' requests have, so a conversation with tools renders and is
checked by the same code for both endpoints (a `function_call_output` is a `tool` message, as
chat completions maps tool results).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import exactdraft.server.tool_calls.requests as tools
from exactdraft.server.fields import ROLES, RequestError, checked_text

TEXT_PARTS = ("input_text", "output_text", "text")


def tool_request(body: Mapping[str, Any], template: str | None) -> tools.ToolRequest | None:
    """The checked `tools`, `tool_choice` and `parallel_tool_calls` of a request (function
    tools, flat: {"type": "function", "name", "description", "parameters", "strict"})."""
    functions = []
    listed = body.get("tools")
    if listed is not None and not isinstance(listed, list):
        raise RequestError("tools must be a list of tools", "tools")
    for index, tool in enumerate(listed or []):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise RequestError(f"{where} must be an object", where)
        if tool.get("type") != "function":
            raise RequestError(f"{where}.type {json.dumps(tool.get('type'))[:40]} is not "
                               "supported; only function tools are", f"{where}.type")
        spec = {key: tool[key] for key in ("name", "description", "parameters", "strict")
                if key in tool}
        functions.append({"type": "function", "function": spec})
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise RequestError('tool_choice must be "auto", "none", "required" or '
                               '{"type": "function", "name": ...}', "tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    chat = {"tools": functions or None, "tool_choice": choice,
            "parallel_tool_calls": body.get("parallel_tool_calls")}
    try:
        return tools.openai_tools(chat, template)
    except RequestError as error:  # name the field as a Responses request writes it
        param = _flat(error.param) if error.param else error.param
        raise RequestError(_flat(str(error)), param, error.status, error.kind) from None


def _flat(text: str) -> str:
    return re.sub(r"(tools\[\d+\])\.function", r"\1", text)


def input_messages(value: Any, calls: dict[str, str]) -> list[dict[str, Any]]:
    """`input` as chat messages: a string is one user message; message items keep their role,
    function_call items are the calls of an assistant message (joined to the assistant
    message just before them) and function_call_output items are tool messages, each
    answering a call made earlier in the conversation. `calls` (call id -> name) holds the
    calls of the conversation so far and gains this input's. A reasoning item's text (its
    reasoning_text content, else its summary) is the `reasoning_content` of the assistant
    message that follows it, for the chat template to render or drop as it does."""
    if isinstance(value, str) and value:
        return [{"role": "user", "content": checked_text(value, "input")}]
    if not isinstance(value, list) or not value:
        raise RequestError("input must be a non-empty string or a list of items", "input")
    messages: list[dict[str, Any]] = []
    thought: dict[str, str] = {}  # the reasoning given for the next assistant message
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise RequestError(f"{where} must be an item object", where)
        kind = item.get("type", "message")
        if kind == "reasoning":
            thought = _reasoning(item, where)
            continue
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise RequestError(f"{where}.role must be one of {', '.join(sorted(ROLES))}",
                                   f"{where}.role")
            messages.append({"role": role, "content": _text(item.get("content"),
                                                            f"{where}.content"),
                             **(thought if role == "assistant" else {})})
            thought = {}
        elif kind == "function_call":
            call = _call(item, where)
            calls[call["id"]] = call["function"]["name"]
            if messages and messages[-1]["role"] == "assistant" and not thought:
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call],
                                 **thought})
            thought = {}
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or call_id not in calls:
                raise RequestError(f"{where}.call_id {json.dumps(call_id)[:80]} answers no "
                                   "function_call earlier in the conversation",
                                   f"{where}.call_id")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": _text(item.get("output"), f"{where}.output")})
        else:
            raise RequestError(f"{where}.type {json.dumps(kind)[:40]} is not supported "
                               "(message, function_call and function_call_output items are)",
                               f"{where}.type")
    return messages


def _reasoning(item: Mapping[str, Any], where: str) -> dict[str, str]:
    """{"reasoning_content": text} of a reasoning item: its reasoning_text parts, else its
    summary_text parts; {} when it has neither (encrypted reasoning only)."""
    for name, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(name)
        if parts is None:
            continue
        if not isinstance(parts, list) or not all(
                isinstance(p, dict) and p.get("type") == part_type and
                isinstance(p.get("text"), str) for p in parts):
            raise RequestError(f"{where}.{name} must be a list of {part_type} parts",
                               f"{where}.{name}")
        if parts:
            return {"reasoning_content": checked_text("".join(p["text"] for p in parts),
                                                      f"{where}.{name}")}
    return {}


def _call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str) or not item[name] and name != "arguments":
            raise RequestError(f"{where}.{name} must be a non-empty string", f"{where}.{name}")
    try:
        arguments = json.loads(item["arguments"])
    except json.JSONDecodeError as error:
        raise RequestError(f"{where}.arguments is not JSON: {error}",
                           f"{where}.arguments") from None
    if not isinstance(arguments, dict):
        raise RequestError(f"{where}.arguments must be a JSON object", f"{where}.arguments")
    return {"id": item["call_id"], "type": "function",
            "function": {"name": item["name"], "arguments": item["arguments"]}}


def _text(content: Any, where: str) -> str:
    """A string, or the text of a list of text parts."""
    if isinstance(content, str):
        return checked_text(content, where)
    if not isinstance(content, list):
        raise RequestError(f"{where} must be a string or a list of text parts", where)
    parts = []
    for index, part in enumerate(content):
        name = f"{where}[{index}]"
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or \
                not isinstance(part.get("text"), str):
            raise RequestError(f"{name} must be a text part ({{\"type\": \"input_text\", "
                               "\"text\": ...}); only text is supported", name)
        parts.append(checked_text(part["text"], name))
    return "".join(parts)
