"""Reading a request body: every field checked, and a bad one named in a RequestError.

Invariant: nothing reaches the engine that was not checked here or by the engine's own checks,
and every refusal is a RequestError carrying the HTTP status and the name of the offending
field as the client wrote it (`messages[2].role`, `top_p`), so the server answers it with a 4xx
JSON error and goes on serving. Sampling fields are checked by building SamplingParams with the
one field, so the server accepts exactly what the Python API accepts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exactdraft.errors import ParameterError, TokenizerError
from exactdraft.prompts import check_text
from exactdraft.sampling.keyed import MAX_TOP_LOGPROBS
from exactdraft.sampling.params import SamplingParams

# Roles a chat prompt may hold; "developer" is OpenAI's newer name for "system".
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


# The largest max_tokens a request may name; whether it fits is the context's to say (Service).
MAX_TOKENS_LIMIT = 2**31 - 1


class RequestError(ParameterError):
    """A request the server refuses; `param` names the field, `status` the HTTP status, `code`
    the OpenAI error code (model_not_found, context_length_exceeded), when it has one."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.kind, self.code = param, status, kind, code

    def wording(self, wire: str) -> str:
        """The message as the API of `wire` ("openai" or "anthropic") words it."""
        return str(self)


class ContextError(RequestError):
    """A prompt that does not fit the model's context, alone (`max_tokens` None) or with its
    max_tokens, in each API's own words: the ones agent clients read to shorten a prompt or
    retry with a smaller max_tokens (Anthropic: `prompt is too long: N tokens > M maximum`,
    ``input length and `max_tokens` exceed context limit: I + M > C``; OpenAI: the code
    context_length_exceeded)."""

    def __init__(self, prompt_tokens: int, max_tokens: int | None, context: int,
                 prompt_field: str) -> None:
        self.prompt_tokens, self.max_tokens, self.context = prompt_tokens, max_tokens, context
        self.prompt_field = prompt_field
        super().__init__(self.wording("openai"), prompt_field if max_tokens is None
                         else "max_tokens", code="context_length_exceeded")

    def wording(self, wire: str) -> str:
        n, m, context = self.prompt_tokens, self.max_tokens, self.context
        if wire == "anthropic":
            if m is None:  # the most a prompt may hold leaves one token for the output
                return f"prompt is too long: {n} tokens > {context - 1} maximum"
            return (f"input length and `max_tokens` exceed context limit: {n} + {m} > "
                    f"{context}, decrease input length or `max_tokens` and try again")
        head = f"This model's maximum context length is {context} tokens. However, "
        what = self.prompt_field
        if m is None:
            return (head + f"your {what} resulted in {n} tokens, which leaves no room for "
                    f"the output. Please reduce the length of the {what}.")
        return (head + f"you requested {n + m} tokens ({n} in the {what}, {m} in the "
                f"completion). Please reduce the length of the {what} or completion.")


@dataclass
class Wanted:
    """What a request asks for, in the engine's terms."""

    prompt: Any  # text, or chat messages [{"role", "content"}]
    max_tokens: int | None
    n: int = 1
    stream: bool = False
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None
    drafts: bool = True
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields given
    include_usage: bool = False
    tools: Any = None  # a server.tools.ToolRequest when the output is read for tool calls
    # What the output must follow (a ConstraintRequest: response_format, the `constraint`
    # extension, or a tool call's grammar; Service.submit builds it); None: free output.
    constraint: ConstraintRequest | None = None
    # The reasoning of a chat reply apart from its answer (server/reasoning/), unless the
    # request sends `"separate_reasoning": false`.
    separate_reasoning: bool = True


# The most UTF-8 bytes of constraint text a request may send (a JSON schema as JSON, a regex, a
# grammar, the choices as a JSON list, each tool's schema and the tool-call grammar). Building
# and compiling grows with the text: about 1 s for 256 KiB of schema on one core.
MAX_CONSTRAINT_BYTES = 256 * 1024


@dataclass(frozen=True)
class ConstraintRequest:
    """A request's constraint, its shape and size checked, not yet built: `build` (slow for a
    big schema: the server runs it in a thread) builds it, compiles it for the tokenizer and
    checks it whole, raising a RequestError naming `field` (or the tool schema's own field)
    for anything that would fail at the first token."""

    field: str
    kind: str  # a row of constraints/kinds.py: json_schema, regex, grammar, gbnf or choices
    value: Any
    # (where, schema) of each tool schema the tool-call grammar holds, checked first so that a
    # schema llguidance cannot follow is refused by its own field, not by the grammar.
    tools: tuple[tuple[str, Any], ...] = ()
    # The special tokens a grammar names (Constraint.grammar's special_tokens): a Harmony
    # call grammar's markers where the tokenizer has them as special tokens.
    special_tokens: tuple[str, ...] = ()
    # The field that declared special_tokens (constraint.special_tokens), which a token the
    # tokenizer lacks is refused by (server/special_tokens.py); "": declared by the server.
    special_tokens_field: str = ""

    def build(self, tokenizer: Any) -> Any:
        for where, schema in self.tools:
            _compiled(where, "json_schema", schema, tokenizer)
        if self.special_tokens_field and tokenizer is not None:
            from exactdraft.server.special_tokens import FieldRefusal, require_served

            try:
                require_served(self.special_tokens, tokenizer, self.special_tokens_field,
                               self.field)
            except FieldRefusal as refusal:
                raise RequestError(str(refusal), refusal.field) from None
        return _compiled(self.field, self.kind, self.value, tokenizer, self.special_tokens)


def _compiled(field_name: str, kind: str, value: Any, tokenizer: Any,
              special_tokens: tuple[str, ...] = ()) -> Any:
    from exactdraft.constraints.kinds import BY_NAME
    from exactdraft.errors import ConstraintError

    try:
        constraint = BY_NAME[kind].build(value, special_tokens=special_tokens) \
            if special_tokens else BY_NAME[kind].build(value)
        if tokenizer is not None:  # without one the engine refuses the constraint itself
            constraint.compile_for(tokenizer)
    except (ConstraintError, TokenizerError, TypeError, ValueError) as error:
        from exactdraft.server.special_tokens import request_wording

        reason = request_wording(str(error).splitlines()[0])
        raise RequestError(f"{field_name}: {reason}", field_name) from None
    return constraint


def _sized(field_name: str, value: Any) -> None:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    size = len(text.encode("utf-8", errors="replace"))
    if size > MAX_CONSTRAINT_BYTES:
        raise RequestError(f"{field_name}: the constraint is {size} bytes; this server "
                           f"compiles at most {MAX_CONSTRAINT_BYTES} (MAX_CONSTRAINT_BYTES)",
                           field_name)


def constraint_from(body: Mapping[str, Any], tool_constraint: ConstraintRequest | None = None
                    ) -> ConstraintRequest | None:
    """The request's constraint: OpenAI's response_format (json_schema or json_object), the
    `constraint` extension (one key naming a row of constraints/kinds.py: {"regex": ...},
    {"grammar": lark}, {"choices": [...]}, ...), or the one its tool_choice asks for
    (server/tool_calls/requests.py's constraint_for); at most one, at most
    MAX_CONSTRAINT_BYTES. A RequestError names the field at fault; the constraint itself is
    built by ConstraintRequest.build. A `strict` response_format's objects are closed
    (server/json_schemas.py) unless the request sends `"closed_objects": false`."""
    from exactdraft.constraints.kinds import BY_NAME
    from exactdraft.server.json_schemas import closed

    found: list[ConstraintRequest] = []
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        kind = response_format.get("type") if isinstance(response_format, dict) else None
        if kind == "json_object":
            found.append(ConstraintRequest("response_format", "json_schema",
                                           {"type": "object"}))
        elif kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise RequestError("response_format.json_schema.schema must be a JSON schema "
                                   "object", "response_format.json_schema.schema")
            if spec.get("strict") is True and \
                    typed(body, "closed_objects", (bool,), "true or false", True):
                schema = closed(schema)
            found.append(ConstraintRequest("response_format", "json_schema", schema))
        else:
            raise RequestError("response_format.type must be text, json_object or json_schema",
                               "response_format.type")
    extension = body.get("constraint")
    if extension is not None:
        from exactdraft.server.special_tokens import (
            FIELD,
            KEY,
            FieldRefusal,
            declared_special_tokens,
        )

        kinds = [key for key in extension if key != KEY] if isinstance(extension, dict) else []
        if len(kinds) != 1 or kinds[0] not in BY_NAME:
            raise RequestError(f"constraint must be an object with (beside a grammar's "
                               f"{KEY}) one of the keys {', '.join(BY_NAME)}", "constraint")
        kind, value = kinds[0], extension[kinds[0]]
        try:
            names = declared_special_tokens(extension, kind)
        except FieldRefusal as refusal:
            raise RequestError(str(refusal), refusal.field) from None
        if names:
            _sized(FIELD, list(names))
        found.append(ConstraintRequest(f"constraint.{kind}", kind, value,
                                       special_tokens=names,
                                       special_tokens_field=FIELD if names else ""))
    if tool_constraint is not None:
        found.append(tool_constraint)
    if len(found) > 1:
        raise RequestError(f"{found[0].field} and {found[1].field} both constrain the output; "
                           "send one", found[1].field)
    if not found:
        return None
    for where, schema in found[0].tools:
        _sized(where, schema)
    _sized(found[0].field, found[0].value)
    return found[0]


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(f"the request body is not valid UTF-8 (byte {error.start})",
                           "body") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as error:
        raise RequestError(f"the request body is not JSON: {error.msg} at line {error.lineno} "
                           f"column {error.colno}", "body") from None
    except RecursionError:
        raise RequestError("the request body nests JSON too deeply", "body") from None
    except ValueError as error:  # a number with more digits than Python converts
        raise RequestError(f"the request body is not JSON this server reads: "
                           f"{str(error)[:120]}", "body") from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got "
                           f"{type(body).__name__}", "body")
    return body


def typed(body: Mapping[str, Any], name: str, kinds: tuple[type, ...], what: str,
          default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise RequestError(f"{name} must be {what}, got {json.dumps(value)}", name)
    if not isinstance(value, kinds):
        raise RequestError(f"{name} must be {what}, got {json.dumps(value)[:80]}", name)
    return value


def integer(body: Mapping[str, Any], name: str, low: int, high: int,
            default: int | None = None) -> int | None:
    value = typed(body, name, (int,), "an integer", default)
    if value is not None and not low <= value <= high:
        raise RequestError(f"{name} must be an integer in [{low}, {high}], got {value}", name)
    return value


# The sampling settings a request may carry: each API's wire name is SamplingParams' own field
# name. Every API takes these (top_k, min_p, repetition_penalty and seed as extensions where
# the API has none) ...
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")
# ... and the OpenAI APIs these as well.
OPENAI_SAMPLING = SAMPLING + ("presence_penalty", "frequency_penalty", "logit_bias")


def sampling_fields(body: Mapping[str, Any], names: Sequence[str] = SAMPLING
                    ) -> dict[str, Any]:
    """SamplingParams fields from the body's fields of those names, each checked by
    SamplingParams itself."""
    found: dict[str, Any] = {}
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if name == "logit_bias":
            value = _logit_bias(value, name)
        try:
            SamplingParams(**{name: value})
        except ParameterError as error:
            raise RequestError(f"{name}: {error}", name) from None
        found[name] = value
    return found


def _logit_bias(value: Any, wire: str) -> dict[int, Any]:
    if not isinstance(value, dict):
        raise RequestError(f"{wire} must be an object of token id -> bias", wire)
    bias = {}
    for key, amount in value.items():
        try:
            token = int(key)
        except ValueError:
            raise RequestError(f"{wire} key {key!r} is not a token id", wire) from None
        bias[token] = amount
    return bias


def stop_strings(body: Mapping[str, Any], name: str, limit: int = 16) -> list[str]:
    value = body.get(name)
    if value is None:
        return []
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or len(strings) > limit or \
            not all(isinstance(s, str) and s for s in strings):
        raise RequestError(f"{name} must be a non-empty string or a list of at most {limit} "
                           "non-empty strings", name)
    for string in strings:
        checked_text(string, name)
    return strings


def text_content(content: Any, where: str) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or \
                    not isinstance(part.get("text"), str):
                raise RequestError(f"{where}[{index}] must be a text part "
                                   '({"type": "text", "text": ...}); only text is supported',
                                   f"{where}[{index}]")
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise RequestError(f"{where} must be a string or a list of text parts", where)
    return checked_text(content, where)


def checked_text(text: str, where: str) -> str:
    """`text`, refused (naming `where`) if it holds a lone surrogate, which is not text."""
    try:
        return check_text(text, where)
    except TokenizerError as error:
        raise RequestError(str(error), where) from None


def chat_messages(value: Any, name: str = "messages",
                  system: str | None = None) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise RequestError(f"{name} must be a non-empty list of messages", name)
    messages = [{"role": "system", "content": system}] if system else []
    for index, message in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(message, dict):
            raise RequestError(f"{where} must be an object with role and content", where)
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role {json.dumps(role)[:40]} is not one of "
                               f"{', '.join(sorted(ROLES))}", f"{where}.role")
        messages.append({"role": ROLES[role],
                         "content": text_content(message.get("content"), f"{where}.content"),
                         **given_reasoning(message, where)})
    return messages


def given_reasoning(message: Mapping[str, Any], where: str) -> dict[str, str]:
    """{"reasoning_content": text} for an assistant message that gives its reasoning back
    (`reasoning_content`, or `reasoning`), for the chat template to render or drop as it
    does; {} otherwise."""
    if message.get("role") != "assistant":
        return {}
    for name in ("reasoning_content", "reasoning"):
        value = message.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise RequestError(f"{where}.{name} must be a string", f"{where}.{name}")
        return {"reasoning_content": checked_text(value, f"{where}.{name}")}
    return {}


def separate_reasoning(body: Mapping[str, Any]) -> bool:
    """The `separate_reasoning` extension: false sends a reasoning model's reply as it was
    written, its reasoning and markup in the text."""
    return typed(body, "separate_reasoning", (bool,), "true or false", True)


def refuse_unsupported(body: Mapping[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        if body.get(name) not in (None, False, [], {}):
            raise RequestError(f"{name} is not supported by this server", name)


def top_logprobs(body: Mapping[str, Any], name: str) -> int:
    return integer(body, name, 0, MAX_TOP_LOGPROBS, 0)
