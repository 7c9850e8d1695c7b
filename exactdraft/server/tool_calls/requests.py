"""Tool calling on the wire: the `tools` and `tool_choice` of OpenAI and Anthropic requests,
and the prompt a chat with tools renders to (the calls and results in the histories are read
by histories.py).

Invariant: a request with tools reaches the engine only after every function and the tool
choice were checked (and the history, by histories.py); a function without a name, a duplicate
name or a tool_choice naming no tool is refused with a RequestError naming the field as the
client wrote it (`tools[1].function.name`, `tool_choice.name`).
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
from exactdraft.server.fields import ConstraintRequest, RequestError, checked_text, typed
from exactdraft.server.json_schemas import closed
from exactdraft.server.tool_calls.formats import (
    GENERIC,
    ToolCallSplitter,
    ToolFormat,
    constraint_grammar,
    detect_format,
)
from exactdraft.server.tool_calls.harmony import SPECIAL_MARKERS, markers_are_special
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


def constraint_for(request: ToolRequest | None,
                   tokenizer: Any = None) -> ConstraintRequest | None:
    """The constraint the output must follow for this request, not yet built (the server
    builds it off the event loop), or None when the output is free (see the module
    docstring). Each function schema the call grammar holds is checked by its own field
    before the grammar, so a schema llguidance cannot follow is named, not the grammar.
    `tokenizer` (the model's): where it has Harmony's markers as special tokens, a Harmony
    call grammar names them as tokens (harmony.markers_are_special)."""
    if request is None or not request.active:
        return None
    functions = [{**f, "parameters": closed(f["parameters"])}
                 if request.closed_objects and "parameters" in f else f
                 for f in request.functions]
    special = request.format.name == "harmony" and markers_are_special(tokenizer)
    try:
        grammar = constraint_grammar(request.format, functions, request.choice,
                                     request.parallel, special)
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
    return ConstraintRequest("tools", "grammar", grammar, schemas,
                             SPECIAL_MARKERS if special else ())


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
