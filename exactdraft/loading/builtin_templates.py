"""Chat templates chosen by the user instead of the checkpoint's: a built-in by name, a Jinja
file, or the template text itself.

Invariant: `chat_template_source` returns a template that compiles in the sandbox of
exactdraft.loading.chat_template, or raises naming the value it was given: an unknown name, a
missing, unreadable, oversized or non-UTF-8 file (ParameterError), or a template that does not
compile (TokenizerError). It reads at most MAX_TEMPLATE_BYTES of a file and runs nothing.

Built-ins (all render tools natively, so exactdraft.server.tool_calls.formats detects their
call format from the source):

| name   | turns                                         | tools and calls                      |
|--------|-----------------------------------------------|--------------------------------------|
| gemma  | <start_of_turn>user / model ... <end_of_turn> | functions listed in the first user   |
|        | (Gemma 3; the system text opens the first     | turn; calls as Python in a           |
|        | user turn; one side's messages share a turn)  | ```tool_code block, results in a     |
|        |                                               | ```tool_output block of a user turn  |
| chatml | <|im_start|>role ... <|im_end|>               | functions in <tools></tools> in the  |
|        |                                               | system turn; calls as JSON in        |
|        |                                               | <tool_call></tool_call>, results in  |
|        |                                               | <tool_response></tool_response>      |
| harmony| <|start|>role<|message|> ... <|end|> (gpt-oss;| functions as a TypeScript namespace  |
|        | loading/harmony_template.py): the system text | in the developer turn; calls on the  |
|        | as the developer's instructions, answers on   | commentary channel to functions.NAME |
|        | the final channel                             | ending <|call|>, results as turns of |
|        |                                               | functions.NAME                       |
"""

from __future__ import annotations

import os

from exactdraft.errors import ParameterError, TokenizerError
from exactdraft.loading.harmony_template import HARMONY

MAX_TEMPLATE_BYTES = 1 << 20

GEMMA = r"""
{%- macro literal(value) -%}
{%- if value is sameas true -%}True{%- elif value is sameas false -%}False
{%- elif value is none -%}None{%- else -%}{{ value | tojson }}{%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- set ns = namespace(opening='', side='', listing=[]) -%}
{%- if messages and messages[0].role == 'system' -%}
{%- set ns.opening = messages[0].content | trim -%}
{%- set history = messages[1:] -%}
{%- else -%}
{%- set history = messages -%}
{%- endif -%}
{%- if tools -%}
{%- set ns.listing = ['You can call functions. To call one or more, write Python calls with '
    + 'keyword arguments inside a tool_code block, and nothing after it:\n```tool_code\n'
    + 'function_name(argument="value")\n```\nThe results come back in a tool_output block. '
    + 'The functions, one JSON object a line:'] -%}
{%- for tool in tools -%}
{%- set ns.listing = ns.listing
    + [(tool.function if tool.function is defined else tool) | tojson] -%}
{%- endfor -%}
{%- set ns.opening = (ns.opening + '\n\n' if ns.opening else '') + ns.listing | join('\n') -%}
{%- endif -%}
{%- if not history and ns.opening -%}
{{- '<start_of_turn>user\n' + ns.opening + '<end_of_turn>\n' -}}
{%- endif -%}
{%- for message in history -%}
{%- set side = 'model' if message.role == 'assistant' else 'user' -%}
{%- if side != ns.side -%}
{%- if ns.side -%}{{- '<end_of_turn>\n' -}}{%- endif -%}
{{- '<start_of_turn>' + side + '\n' -}}
{%- if loop.first and ns.opening -%}{{- ns.opening + '\n\n' -}}{%- endif -%}
{%- else -%}
{{- '\n\n' -}}
{%- endif -%}
{%- set ns.side = side -%}
{%- if message.role == 'tool' -%}
{{- '```tool_output\n' + message.content | trim + '\n```' -}}
{%- else -%}
{{- message.content | trim -}}
{%- if message.tool_calls -%}
{%- if message.content | trim -%}{{- '\n' -}}{%- endif -%}
{{- '```tool_code\n' -}}
{%- for call in message.tool_calls -%}
{%- set function = call.function if call.function is defined else call -%}
{{- function.name + '(' -}}
{%- if function.arguments is mapping -%}
{%- for name, value in function.arguments.items() -%}
{{- (', ' if not loop.first else '') + name + '=' + literal(value) -}}
{%- endfor -%}
{%- endif -%}
{{- ')\n' -}}
{%- endfor -%}
{{- '```' -}}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if ns.side -%}{{- '<end_of_turn>\n' -}}{%- endif -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}
"""

CHATML = r"""
{%- set ns = namespace(system='', in_results=false, listing=[]) -%}
{%- if messages and messages[0].role == 'system' -%}
{%- set ns.system = messages[0].content -%}
{%- set history = messages[1:] -%}
{%- else -%}
{%- set history = messages -%}
{%- endif -%}
{%- if tools -%}
{%- set ns.listing = ['# Tools\n\nYou can call functions. Their signatures, one JSON object a '
    + 'line, inside <tools></tools>:\n<tools>'] -%}
{%- for tool in tools -%}
{%- set ns.listing = ns.listing
    + [(tool.function if tool.function is defined else tool) | tojson] -%}
{%- endfor -%}
{%- set ns.listing = ns.listing + ['</tools>\n\nTo call a function, write a JSON '
    + 'object with its name and arguments inside <tool_call></tool_call> tags:\n'
    + '<tool_call>\n{"name": <function name>, "arguments": <the arguments as a JSON '
    + 'object>}\n</tool_call>'] -%}
{%- set ns.system = (ns.system + '\n\n' if ns.system else '') + ns.listing | join('\n') -%}
{%- endif -%}
{%- if ns.system -%}{{- '<|im_start|>system\n' + ns.system + '<|im_end|>\n' -}}{%- endif -%}
{%- for message in history -%}
{%- if message.role == 'tool' -%}
{%- if not ns.in_results -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
{%- set ns.in_results = true -%}
{%- else -%}
{%- if ns.in_results -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- set ns.in_results = false -%}
{{- '<|im_start|>' + message.role + '\n' + message.content -}}
{%- for call in message.tool_calls or [] -%}
{%- set function = call.function if call.function is defined else call -%}
{{- '\n<tool_call>\n{"name": ' + function.name | tojson + ', "arguments": '
    + function.arguments | tojson + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if ns.in_results -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

BUILTIN_TEMPLATES = {"gemma": GEMMA, "chatml": CHATML, "harmony": HARMONY}


def chat_template_source(value: str | os.PathLike[str]) -> str:
    """The template `value` names: a built-in's name (BUILTIN_TEMPLATES), the text of a template
    (text holding "{{" or "{%"), or the path of a Jinja file. Checked to compile (see the module
    invariant)."""
    if not isinstance(value, (str, os.PathLike)):
        raise ParameterError(f"chat_template must be a built-in name, a file path or template "
                             f"text, got {type(value).__name__} {value!r}")
    text = value if isinstance(value, str) else os.fspath(value)
    if isinstance(value, str) and value in BUILTIN_TEMPLATES:
        source = BUILTIN_TEMPLATES[value]
    elif isinstance(value, str) and ("{{" in value or "{%" in value):
        source = value
    else:
        source = _read_template_file(text)
    from exactdraft.loading.chat_template import ChatTemplate

    try:
        ChatTemplate(source)
    except TokenizerError as error:
        raise TokenizerError(f"chat_template {_shown(text)}: {error}") from None
    return source


def _read_template_file(path: str) -> str:
    known = ", ".join(BUILTIN_TEMPLATES)
    if not os.path.isfile(os.path.expanduser(path)):
        reason = "is a folder" if os.path.isdir(path) else "no such file"
        raise ParameterError(f"chat_template {path!r} is neither a built-in template ({known}) "
                             f"nor a template file: {reason}")
    try:
        with open(os.path.expanduser(path), "rb") as handle:
            data = handle.read(MAX_TEMPLATE_BYTES + 1)
    except OSError as error:
        raise ParameterError(f"chat_template {path!r} cannot be read: "
                             f"{error.strerror or error}") from None
    if len(data) > MAX_TEMPLATE_BYTES:
        raise ParameterError(f"chat_template {path!r} is larger than {MAX_TEMPLATE_BYTES} bytes; "
                             "refusing it")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ParameterError(f"chat_template {path!r} is not UTF-8 text") from None


def _shown(text: str) -> str:
    """The value as an error names it: a path or name whole, template text cut short."""
    return repr(text if len(text) <= 60 else text[:57] + "...")
