"""The built-in `harmony` chat template: OpenAI's Harmony turns for gpt-oss checkpoints that
carry no template of their own.

Invariant: the template renders only what the messages and tools hold, in the format's fixed
markup: a system turn (the reasoning effort and the valid channels), a developer turn with the
system message's text as instructions and the functions as a TypeScript-like namespace, user
turns, the assistant's answers on the final channel, its calls as messages to
`functions.NAME` on the commentary channel with JSON arguments ended by <|call|>, and the
results as turns of `functions.NAME` to the assistant; the generation prompt is
`<|start|>assistant`, after which the model writes its channel. Earlier reasoning is not
rendered (the format drops it from past turns).
"""

HARMONY = r"""
{%- macro type_of(schema) -%}
{%- if schema.enum is defined -%}
{%- for value in schema.enum -%}{{ value | tojson }}{%- if not loop.last %} | {% endif -%}
{%- endfor -%}
{%- elif schema.type == 'string' -%}string
{%- elif schema.type == 'integer' or schema.type == 'number' -%}number
{%- elif schema.type == 'boolean' -%}boolean
{%- elif schema.type == 'array' and schema['items'] is defined -%}
{{- type_of(schema['items']) }}[]
{%- else -%}any
{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(instructions='', names=[], next=0) -%}
{%- if messages and messages[0].role in ('system', 'developer') -%}
{%- set ns.instructions = messages[0].content | trim -%}
{%- set history = messages[1:] -%}
{%- else -%}
{%- set history = messages -%}
{%- endif -%}
{{- '<|start|>system<|message|>Reasoning: ' + (reasoning_effort | default('medium')) + '\n\n'
    + '# Valid channels: analysis, commentary, final. Channel must be included for every '
    + 'message.' -}}
{%- if tools -%}
{{- "\nCalls to these tools must go to the commentary channel: 'functions'." -}}
{%- endif -%}
{{- '<|end|>' -}}
{%- if ns.instructions or tools -%}
{{- '<|start|>developer<|message|>' -}}
{%- if ns.instructions -%}{{- '# Instructions\n\n' + ns.instructions -}}{%- endif -%}
{%- if tools -%}
{%- if ns.instructions -%}{{- '\n\n' -}}{%- endif -%}
{{- '# Tools\n\n## functions\n\nnamespace functions {\n\n' -}}
{%- for tool in tools -%}
{%- set function = tool.function if tool.function is defined else tool -%}
{%- if function.description -%}{{- '// ' + function.description + '\n' -}}{%- endif -%}
{%- set parameters = function.parameters or {} -%}
{%- if parameters.properties -%}
{{- 'type ' + function.name + ' = (_: {\n' -}}
{%- for name, schema in parameters.properties.items() -%}
{%- if schema.description -%}{{- '// ' + schema.description + '\n' -}}{%- endif -%}
{{- name -}}{%- if name not in (parameters.required or []) -%}?{%- endif -%}
{{- ': ' + type_of(schema) + ',\n' -}}
{%- endfor -%}
{{- '}) => any;\n\n' -}}
{%- else -%}
{{- 'type ' + function.name + ' = () => any;\n\n' -}}
{%- endif -%}
{%- endfor -%}
{{- '} // namespace functions' -}}
{%- endif -%}
{{- '<|end|>' -}}
{%- endif -%}
{%- for message in history -%}
{%- if message.role == 'assistant' -%}
{%- if message.content | trim -%}
{{- '<|start|>assistant<|channel|>final<|message|>' + message.content | trim + '<|end|>' -}}
{%- endif -%}
{%- set ns.names = [] -%}
{%- set ns.next = 0 -%}
{%- for call in message.tool_calls or [] -%}
{%- set function = call.function if call.function is defined else call -%}
{%- set ns.names = ns.names + [function.name] -%}
{{- '<|start|>assistant<|channel|>commentary to=functions.' + function.name
    + ' <|constrain|>json<|message|>' -}}
{%- if function.arguments is string -%}{{- function.arguments -}}
{%- else -%}{{- function.arguments | tojson -}}{%- endif -%}
{{- '<|call|>' -}}
{%- endfor -%}
{%- elif message.role == 'tool' -%}
{%- if message.name is defined and message.name -%}{%- set name = message.name -%}
{%- elif ns.next < ns.names | length -%}{%- set name = ns.names[ns.next] -%}
{%- else -%}{%- set name = 'tool' -%}
{%- endif -%}
{%- set ns.next = ns.next + 1 -%}
{{- '<|start|>functions.' + name + ' to=assistant<|channel|>commentary<|message|>'
    + message.content + '<|end|>' -}}
{%- else -%}
{{- '<|start|>' + message.role + '<|message|>' + message.content + '<|end|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}
"""
