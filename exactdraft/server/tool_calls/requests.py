"""Tool calling on the wire: the `tools` and `tool_choice` of OpenAI and Anthropic requests,
the calls and results in their histories, and the prompt they render to.

Invariant: a request with tools reaches the engine only after every function, the tool choice
and every call and result in the history were checked; a function without a name, a duplicate
name, a tool_choice naming no tool, a call whose arguments are not a JSON object, or a result
answering no call is refused with a RequestError naming the field as the client wrote it
(`tools[1].function.name`, `messages[3].tool_call_id`, `messages[2].content[0].tool_use_id`).
Calls in the model's output are read by exactdraft/server/tool_calls/formats.py in the format
the checkpoint's chat template uses (the generic format, with exactdraft's tools prompt, where
the template has no tool support).

Constraints: `constraint_for` is the one hook that says what the output must follow: the
constraint (a Lark grammar in llguidance's dialect) of the calls a request requires (tool_choice
required or named) or of strict functions' arguments, for the engine's constraint support to
apply. Arguments are compact JSON (exactdraft.constraints.COMPACT_JSON) and the objects of the
schemas are closed (server/json_schemas.py) unless the request sends `"closed_objects": false`;
a schema the constraint cannot be built from is refused naming its field
(`tools[2].function.parameters`, `tools[2].input_schema`).

How many calls: a named tool_choice gives exactly one; "required" (Anthropic "any") one unless
parallel calls are asked for (OpenAI `parallel_tool_calls: true`, Anthropic
`disable_parallel_tool_use: false`); "auto" as each API documents its default, several unless
refused (`parallel_tool_calls: false`, `disable_parallel_tool_use: true`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exactdraft.errors import ParameterError, TokenizerError
from exactdraft.loading.chat_template import render_chat_with_tools
from exactdraft.server.fields import (
    ROLES,
    ConstraintRequest,
    RequestError,
    checked_text,
    given_reasoning,
    text_content,
    typed,
)
from exactdraft.server.json_schemas import closed
from exactdraft.server.tool_calls.formats import (
    GENERIC,
    ToolCallSplitter,
    ToolFormat,
    constraint_grammar,
    detect_format,
)
from exactdraft.server.tool_calls.readers import ToolCallError

NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


@dataclass
class ToolRequest:
    """The tools of one request: the functions, the choice ("auto", "none", "required" or a
    function's name), whether calls may come several at a time, the call format, where each
    function's schema is in the request (for errors), and whether its objects are closed."""

    functions: list[dict[str, Any]]
    choice: str = "auto"
    parallel: bool = True
    format: ToolFormat = GENERIC
    schema_fields: list[str] = field(default_factory=list)
    closed_objects: bool = True
    schemas: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.schemas = {f["name"]: f.get("parameters") for f in self.functions}

    @property
    def active(self) -> bool:
        """Whether the output is read for calls (not for tool_choice none)."""
        return bool(self.functions) and self.choice != "none"

    def splitter(self, id_prefix: str) -> ToolCallSplitter:
        return ToolCallSplitter(self.format, self.schemas, id_prefix=id_prefix,
                                max_calls=None if self.parallel else 1)


def constraint_for(request: ToolRequest | None) -> ConstraintRequest | None:
    """The constraint the output must follow for this request, not yet built (the server
    builds it off the event loop), or None when the output is free (see the module
    docstring). Each function schema the call grammar holds is checked by its own field
    before the grammar, so a schema llguidance cannot follow is named, not the grammar."""
    if request is None or not request.active:
        return None
    functions = [{**f, "parameters": closed(f["parameters"])}
                 if request.closed_objects and "parameters" in f else f
                 for f in request.functions]
    try:
        grammar = constraint_grammar(request.format, functions, request.choice,
                                     request.parallel)
    except ToolCallError as error:
        raise RequestError(str(error), "tool_choice") from None
    if grammar is None:
        return None
    fields = request.schema_fields or [f"tools[{i}]" for i in range(len(functions))]
    schemas = tuple((where, function["parameters"])
                    for function, where in zip(functions, fields)
                    if function.get("parameters") is not None and (
                        request.choice == "required" or function["name"] == request.choice or
                        (request.choice == "auto" and function.get("strict"))))
    return ConstraintRequest("tools", "grammar", grammar, schemas)


def _parallel(choice: str, asked: bool | None) -> bool:
    """Whether calls may come several at a time (see the module docstring); `asked`: what the
    request says, None when it says nothing."""
    if choice not in ("auto", "required", "none"):
        return False  # a named function: exactly one call
    if asked is not None:
        return asked
    return choice != "required"


def _function(name: Any, description: Any, parameters: Any, strict: Any,
              where: str, name_field: str, schema_field: str,
              schema_required: bool = False) -> dict[str, Any]:
    if schema_required and parameters is None:
        raise RequestError(f"{where}.{schema_field} is required: the JSON schema of the "
                           "tool's input", f"{where}.{schema_field}")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise RequestError(f"{where}.{name_field} must be a name of 1 to 128 letters, digits, "
                           f"'_', '-', '.' or ':', got {json.dumps(name)[:80]}",
                           f"{where}.{name_field}")
    if description is not None and not isinstance(description, str):
        raise RequestError(f"{where}.description must be a string", f"{where}.description")
    if parameters is not None and not isinstance(parameters, dict):
        raise RequestError(f"{where}.{schema_field} must be a JSON schema object",
                           f"{where}.{schema_field}")
    if strict is not None and not isinstance(strict, bool):
        raise RequestError(f"{where}.strict must be true or false", f"{where}.strict")
    checked_text(description or "", f"{where}.description")
    # Only the fields the client gave: a template renders the function as it was declared.
    given = {"name": name, "description": description, "parameters": parameters,
             "strict": strict}
    return {key: value for key, value in given.items() if value is not None}


def _unique(functions: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    seen: set[str] = set()
    for index, function in enumerate(functions):
        if function["name"] in seen:
            raise RequestError(f"{where}[{index}] repeats the function name "
                               f"{function['name']!r}", f"{where}[{index}]")
        seen.add(function["name"])
    return functions


def _tool_list(body: Mapping[str, Any]) -> list[Any]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of tools", "tools")
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise RequestError(f"tools[{index}] must be an object", f"tools[{index}]")
    return tools


def _named(choice: str, functions: list[dict[str, Any]], where: str) -> str:
    if choice not in {f["name"] for f in functions}:
        raise RequestError(f"{where} names {choice[:80]!r}, which is not one of the tools",
                           where)
    return choice


def openai_tools(body: Mapping[str, Any], template: str | None) -> ToolRequest | None:
    """The checked tools of a chat completion request, or None when it has none."""
    functions = []
    for index, tool in enumerate(_tool_list(body)):
        where = f"tools[{index}]"
        if tool.get("type", "function") != "function":
            raise RequestError(f"{where}.type {json.dumps(tool.get('type'))[:40]} is not "
                               "supported; only function tools are", f"{where}.type")
        spec = tool.get("function")
        if not isinstance(spec, dict):
            raise RequestError(f"{where}.function must be an object with a name",
                               f"{where}.function")
        functions.append(_function(spec.get("name"), spec.get("description"),
                                   spec.get("parameters"), spec.get("strict"),
                                   f"{where}.function", "name", "parameters"))
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if \
            isinstance(choice.get("function"), dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise RequestError('tool_choice must be "auto", "none", "required" or '
                               '{"type": "function", "function": {"name": ...}}', "tool_choice")
        choice = _named(name, functions, "tool_choice")
    elif choice is None:
        choice = "auto"
    elif choice not in ("auto", "none", "required"):
        raise RequestError(f'tool_choice must be "auto", "none", "required" or a named '
                           f"function, got {json.dumps(choice)[:80]}", "tool_choice")
    if not functions:
        if choice not in ("auto", "none"):
            raise RequestError("tool_choice needs tools", "tool_choice")
        return None
    parallel = _parallel(choice, typed(body, "parallel_tool_calls", (bool,), "true or false"))
    return ToolRequest(_unique(functions, "tools"), choice, parallel, detect_format(template),
                       [f"tools[{i}].function.parameters" for i in range(len(functions))],
                       _closed_objects(body))


def _closed_objects(body: Mapping[str, Any]) -> bool:
    return typed(body, "closed_objects", (bool,), "true or false", True)


def anthropic_tools(body: Mapping[str, Any], template: str | None) -> ToolRequest | None:
    """The checked tools of an Anthropic messages request, or None when it has none."""
    functions = []
    for index, tool in enumerate(_tool_list(body)):
        where = f"tools[{index}]"
        if tool.get("type") not in (None, "custom"):
            raise RequestError(f"{where}.type {json.dumps(tool.get('type'))[:60]} is not "
                               "supported; only custom tools (name, input_schema) are",
                               f"{where}.type")
        functions.append(_function(tool.get("name"), tool.get("description"),
                                   tool.get("input_schema"), tool.get("strict"),
                                   where, "name", "input_schema", schema_required=True))
    choice = body.get("tool_choice")
    asked = None
    if choice is None:
        choice = "auto"
    elif not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool",
                                                                      "none"):
        raise RequestError('tool_choice must be {"type": "auto" | "any" | "tool" | "none"}',
                           "tool_choice")
    else:
        disable = typed(choice, "disable_parallel_tool_use", (bool,), "true or false")
        asked = None if disable is None else not disable
        kind = choice["type"]
        if kind == "tool":
            if not isinstance(choice.get("name"), str):
                raise RequestError('tool_choice {"type": "tool"} needs a name',
                                   "tool_choice.name")
            choice = _named(choice["name"], functions, "tool_choice.name")
        else:
            choice = {"any": "required"}.get(kind, kind)
    if not functions:
        if choice not in ("auto", "none"):
            raise RequestError("tool_choice needs tools", "tool_choice")
        return None
    return ToolRequest(_unique(functions, "tools"), choice, _parallel(choice, asked),
                       detect_format(template),
                       [f"tools[{i}].input_schema" for i in range(len(functions))],
                       _closed_objects(body))


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
    openai_history gives, checked (see the invariant)."""
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
            elif kind in ("thinking", "redacted_thinking") and role == "assistant":
                continue  # a client returns the reasoning it was given; a template has none
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
    """Whether raw request messages hold tool calls or results (so tools.py must read them)."""
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


def prompt_ids(service: Any, messages: list[dict[str, Any]],
               request: ToolRequest | None) -> list[int]:
    """The token ids of a chat with tools, rendered through the checkpoint's template (its own
    tools support, or the generic tools prompt)."""
    tokenizer = service.tokenizer
    if tokenizer is None or tokenizer.chat_template is None:
        raise RequestError("this model has no chat template to render tools with", "messages")
    functions = request.functions if request is not None and request.active else []
    choice = request.choice if request is not None else "auto"
    parallel = request.parallel if request is not None else True
    native = request.format is not GENERIC if request is not None else None
    try:
        text = render_chat_with_tools(tokenizer, messages, functions, choice=choice,
                                      parallel=parallel, native=native)
        return tokenizer.encode(checked_text(text, "messages"), add_special_tokens=False)
    except (TokenizerError, ParameterError) as error:
        if isinstance(error, RequestError):
            raise
        raise RequestError(f"messages: {error}", "messages") from None
