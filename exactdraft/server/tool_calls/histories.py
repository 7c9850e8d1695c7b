"""Chat histories with tool calls: the calls and tool results in OpenAI and Anthropic messages
(and the Responses API's input, as OpenAI messages), checked and made the chat messages a chat
template renders.

Invariant: a history reaches a template only after every call and result was checked; a call
whose arguments are not a JSON object, a call without an id or name, or a result answering no
earlier call is refused with a RequestError naming the field as the client wrote it
(`messages[3].tool_call_id`, `messages[1].tool_calls[0].function.arguments`,
`messages[2].content[0].tool_use_id`). An assistant message's reasoning given back
(`reasoning_content`) is kept for the template (fields.given_reasoning).
"""

from __future__ import annotations

import json
from typing import Any

from exactdraft.server.fields import (
    ROLES,
    RequestError,
    checked_text,
    given_reasoning,
    text_content,
)


def _arguments(value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise RequestError(f"{where} is not JSON: {error}", where) from None
    if not isinstance(value, dict):
        raise RequestError(f"{where} must be a JSON object", where)
    return value


def openai_history(value: Any) -> list[dict[str, Any]]:
    """Chat messages with their tool calls and tool results, checked (see the invariant)."""
    if not isinstance(value, list) or not value:
        raise RequestError("messages must be a non-empty list of messages", "messages")
    messages: list[dict[str, Any]] = []
    calls: dict[str, str] = {}  # call id -> function name, from earlier assistant messages
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} must be an object with role and content", where)
        role = message.get("role")
        if role not in (*ROLES, "tool"):
            raise RequestError(f"{where}.role {json.dumps(role)[:40]} is not one of "
                               f"{', '.join(sorted((*ROLES, 'tool')))}", f"{where}.role")
        content = message.get("content")
        if role == "assistant" and content is None:  # a reply that was only calls, or cut
            content = ""
        entry: dict[str, Any] = {"role": ROLES.get(role, role),
                                 "content": text_content(content, f"{where}.content"),
                                 **given_reasoning(message, where)}
        if role == "assistant" and message.get("tool_calls") is not None:
            entry["tool_calls"] = _openai_calls(message["tool_calls"], f"{where}.tool_calls",
                                                calls)
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in calls:
                raise RequestError(f"{where}.tool_call_id {json.dumps(call_id)[:80]} answers "
                                   "no tool call of an earlier assistant message",
                                   f"{where}.tool_call_id")
            entry.update(tool_call_id=call_id, name=calls[call_id])
        messages.append(entry)
    return messages


def _openai_calls(value: Any, where: str, calls: dict[str, str]) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise RequestError(f"{where} must be a list of tool calls", where)
    checked = []
    for index, call in enumerate(value):
        at = f"{where}[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(call.get("id"), str):
            raise RequestError(f"{at} must be {{\"id\", \"type\": \"function\", \"function\": "
                               "{\"name\", \"arguments\"}}", at)
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(f"{at}.function.name must be a function name",
                               f"{at}.function.name")
        arguments = _arguments(function.get("arguments"), f"{at}.function.arguments")
        calls[call["id"]] = name
        checked.append({"id": call["id"], "type": "function",
                        "function": {"name": name, "arguments": arguments}})
    return checked


def anthropic_history(value: Any, system: str | None) -> list[dict[str, Any]]:
    """Anthropic messages (text, tool_use and tool_result blocks) as chat messages in the form
    openai_history gives, checked (see the invariant). Thinking blocks are taken out before,
    into the message's `reasoning_content` (anthropic_api.thinking_apart)."""
    if not isinstance(value, list) or not value:
        raise RequestError("messages must be a non-empty list of messages", "messages")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    calls: dict[str, str] = {}
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise RequestError(f"{where}.role must be user or assistant", f"{where}.role")
        role, content = message["role"], message.get("content")
        reasoning = given_reasoning(message, where)
        if isinstance(content, str):
            messages.append({"role": role, "content": checked_text(content,
                                                                   f"{where}.content"),
                             **reasoning})
            continue
        if not isinstance(content, list):
            raise RequestError(f"{where}.content must be a string or a list of blocks",
                               f"{where}.content")
        texts, uses, results = [], [], []
        for number, block in enumerate(content):
            at = f"{where}.content[{number}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(text_content([block], f"{where}.content"))
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"),
                                                                          str):
                    raise RequestError(f"{at} needs an id and a name", at)
                uses.append({"id": block["id"], "type": "function", "function": {
                    "name": block["name"],
                    "arguments": _arguments(block.get("input", {}), f"{at}.input")}})
                calls[block["id"]] = block["name"]
            elif kind == "tool_result" and role == "user":
                call_id = block.get("tool_use_id")
                if call_id not in calls:
                    raise RequestError(f"{at}.tool_use_id {json.dumps(call_id)[:80]} answers "
                                       "no tool_use of an earlier assistant message",
                                       f"{at}.tool_use_id")
                result = block.get("content", "")
                text = text_content(result, f"{at}.content") if result is not None else ""
                if block.get("is_error"):
                    text = "Error: " + text
                results.append({"role": "tool", "content": text, "tool_call_id": call_id,
                                "name": calls[call_id]})
            else:
                raise RequestError(f"{at}.type {json.dumps(kind)[:40]} is not supported in a "
                                   f"{role} message (text, tool_use from the assistant and "
                                   "tool_result from the user are)", f"{at}.type")
        messages += results
        if uses:
            messages.append({"role": role, "content": "".join(texts), "tool_calls": uses,
                             **reasoning})
        elif texts or not results:
            messages.append({"role": role, "content": "".join(texts), **reasoning})
    return messages


def uses_tools(messages: Any) -> bool:
    """Whether raw request messages hold tool calls or results (so these histories read
    them)."""
    if not isinstance(messages, list):
        return False
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "tool" or message.get("tool_calls"):
            return True
        content = message.get("content")
        if isinstance(content, list) and any(
                isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result")
                for b in content):
            return True
    return False
