"""Chat templates with tools: tiny random checkpoints carrying a Qwen3-style template (tools in
<tools></tools>, calls in <tool_call> JSON) and a Llama-3.1-style template (JSON calls with
"parameters", results as ipython turns), written here from the published formats, render a chat
with tools, calls and results exactly as transformers renders the same template; the call the
template writes into the history parses back with the format detected from the template; and a
template without tool support (the tiny models' own) renders the generic tools prompt."""

from __future__ import annotations

import json
import os

import pytest

from exactdraft.errors import TokenizerError
from exactdraft.loading.chat_template import (
    GENERIC_CALL_START,
    generic_tools_prompt,
    render_chat_with_tools,
    template_supports_tools,
)
from exactdraft.loading.tokenizer import Tokenizer
from exactdraft.server.tool_calls.formats import ToolCall, detect_format, parse_tool_calls
from tests.conftest import build_tiny_checkpoint

QWEN3 = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' }}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": ' }}
{{- '<function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls or [] %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
{{- tool_call.arguments | tojson }}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
{{- '<|im_start|>user' }}
{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
{{- '<|im_end|>\\n' }}
{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

LLAMA3 = """{{- bos_token }}
{%- if messages[0].role == 'system' %}
{%- set system_message = messages[0].content %}
{%- set messages = messages[1:] %}
{%- else %}
{%- set system_message = '' %}
{%- endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}
{%- if tools is not none %}{{- 'Environment: ipython\\n' }}{%- endif %}
{{- system_message + '<|eot_id|>' }}
{%- if tools is not none and messages | length > 0 %}
{%- set first_user_message = messages[0].content %}
{%- set messages = messages[1:] %}
{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}
{{- 'Given the following functions, please respond with a JSON for a function call with its ' }}
{{- 'proper arguments that best answers the given prompt.\\n\\n' }}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name ' }}
{{- 'and its value}. Do not use variables.\\n\\n' }}
{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}
{{- first_user_message + '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role in ['user', 'system'] or
      (message.role == 'assistant' and not message.tool_calls) %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content }}
{{- '<|eot_id|>' }}
{%- elif message.tool_calls %}
{%- set tool_call = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{{- '{"name": "' + tool_call.name + '", "parameters": ' }}
{{- tool_call.arguments | tojson }}
{{- '}<|eot_id|>' }}
{%- elif message.role == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

WEATHER = {"name": "get_weather", "description": "The weather in a city now",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
CALL = {"id": "call_7", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_7", "name": "get_weather",
         "content": "rain, 12 C"},
        {"role": "assistant", "content": "It rains."},
        {"role": "user", "content": "And tomorrow?"}]


@pytest.fixture(scope="module")
def checkpoint_with(tmp_path_factory):
    """template -> a tiny random checkpoint folder whose tokenizer carries that template."""
    made = {}

    def make(name: str, template: str) -> str:
        if name not in made:
            folder = build_tiny_checkpoint(str(tmp_path_factory.mktemp(name)), "qwen3"
                                           if name == "qwen3" else "llama")
            path = os.path.join(folder, "tokenizer_config.json")
            with open(path) as handle:
                config = json.load(handle)
            config["chat_template"] = template
            with open(path, "w") as handle:
                json.dump(config, handle)
            made[name] = folder
        return made[name]

    return make


def transformers_rendering(folder: str, messages, tools) -> str:
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=True)


@pytest.mark.parametrize("name, template, expected", [("qwen3", QWEN3, "hermes"),
                                                      ("llama3", LLAMA3, "llama3")])
def test_a_tools_template_renders_as_transformers_renders_it(checkpoint_with, name, template,
                                                             expected):
    folder = checkpoint_with(name, template)
    tokenizer = Tokenizer.from_folder(folder)
    assert template_supports_tools(tokenizer.chat_template)
    assert detect_format(tokenizer.chat_template).name == expected
    ours = render_chat_with_tools(tokenizer, CHAT, [WEATHER])
    tools = [{"type": "function", "function": WEATHER}]
    assert ours == transformers_rendering(folder, CHAT, tools)
    assert WEATHER["description"] in ours and '"required": [' in ours  # the signature
    # Negative control: the same chat without the tools renders differently (no signatures).
    plain = render_chat_with_tools(tokenizer, CHAT, [])
    assert plain == transformers_rendering(folder, CHAT, None) and plain != ours
    assert WEATHER["description"] not in plain


@pytest.mark.parametrize("name, template, start, end", [
    ("qwen3", QWEN3, "<|im_start|>assistant", "<|im_end|>"),
    ("llama3", LLAMA3, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>")])
def test_the_call_a_template_writes_parses_back_in_its_detected_format(checkpoint_with, name,
                                                                       template, start, end):
    tokenizer = Tokenizer.from_folder(checkpoint_with(name, template))
    rendered = render_chat_with_tools(tokenizer, CHAT, [WEATHER])
    turn = rendered.split(start)[1].split(end)[0]  # the first assistant turn: the call
    content, calls = parse_tool_calls(turn, detect_format(tokenizer.chat_template),
                                      {"get_weather": WEATHER["parameters"]})
    assert content.strip() == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather",
                                                                    {"city": "Paris"})]


def test_a_template_without_tools_renders_the_generic_prompt(tiny_checkpoints):
    tokenizer = Tokenizer.from_folder(tiny_checkpoints["llama"])
    assert not template_supports_tools(tokenizer.chat_template)
    assert detect_format(tokenizer.chat_template).name == "generic"
    rendered = render_chat_with_tools(tokenizer, CHAT, [WEATHER], choice="get_weather",
                                      parallel=False)
    prompt = generic_tools_prompt([WEATHER], "get_weather", parallel=False)
    assert rendered.startswith("<system>Be brief.\n\n" + prompt + "</s>")
    assert "You must call the function get_weather. Call at most one function" in prompt
    assert json.dumps(WEATHER["parameters"]) in prompt
    # The history's call is written in the generic markup, and parses back with it.
    turn = rendered.split("<assistant>")[1].split("</s>")[0]
    assert turn.startswith(GENERIC_CALL_START)
    assert parse_tool_calls(turn, detect_format(None), None)[1] == [
        ToolCall("call_0", "get_weather", '{"city": "Paris"}')]
    # The result comes back as user text naming the call; roles still alternate.
    assert '<user><tool_response>{"name": "get_weather", "id": "call_7", "result": ' \
           '"rain, 12 C"}</tool_response></s>' in rendered
    roles = [part.split(">")[0] for part in rendered.split("<")[1:] if
             part.split(">")[0] in ("system", "user", "assistant")]
    assert all(a != b for a, b in zip(roles, roles[1:]))


def test_no_functions_render_the_history_alone(tiny_checkpoints):
    """tool_choice none: no tools prompt, the history's calls still written out."""
    tokenizer = Tokenizer.from_folder(tiny_checkpoints["llama"])
    rendered = render_chat_with_tools(tokenizer, CHAT, [])
    assert rendered.startswith("<system>Be brief.</s>") and "You can call" not in rendered
    assert GENERIC_CALL_START in rendered


GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set first_user_prefix = '' -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
{%- endif -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}
{{- message['content'] | trim }}
{{- '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}
"""


def test_a_template_that_insists_on_alternating_roles_renders_parallel_results(
        checkpoint_with):
    """A Gemma-3-style template (no tools, strict user/model alternation): two results of
    parallel calls join one user turn, and the tools prompt joins the first user turn."""
    tokenizer = Tokenizer.from_folder(checkpoint_with("gemma3-template", GEMMA3))
    second = {**CALL, "id": "call_8", "function": {"name": "get_weather",
                                                   "arguments": {"city": "Oslo"}}}
    chat = [*CHAT[:2], {"role": "assistant", "content": "", "tool_calls": [CALL, second]},
            CHAT[3], {"role": "tool", "tool_call_id": "call_8", "name": "get_weather",
                      "content": "snow"}, *CHAT[4:]]
    rendered = render_chat_with_tools(tokenizer, chat, [WEATHER])
    turns = rendered.split("<start_of_turn>")[1:]
    assert [t.split("\n")[0] for t in turns] == ["user", "model", "user", "model", "user",
                                                 "model"]
    assert turns[0].startswith("user\nBe brief.\n\n" + generic_tools_prompt([WEATHER])[:40])
    assert turns[1].count(GENERIC_CALL_START) == 2
    assert '"result": "rain, 12 C"' in turns[2] and '"result": "snow"' in turns[2]
    # Control: the same chat with the tool results left as their own messages breaks it.
    with pytest.raises(TokenizerError, match="alternate"):
        tokenizer.render_chat([{"role": m["role"], "content": m.get("content") or "x"}
                               for m in chat if m["role"] != "system"])
