"""Chat templates chosen by the user: the gemma and chatml built-ins render a conversation with
a system prompt, tool definitions, an assistant tool call and a tool result, whole and exactly;
the call each writes parses back in the format detected from its source; a plain Gemma chat
renders as Gemma 3's turns; a Jinja file or template text works through from_pretrained and the
command line; an unknown name, a missing, unreadable or broken file is refused naming it."""

from __future__ import annotations

import json

import pytest

import exactdraft as xd
from exactdraft.cli import main
from exactdraft.errors import ParameterError, TokenizerError
from exactdraft.loading.builtin_templates import (
    BUILTIN_TEMPLATES,
    MAX_TEMPLATE_BYTES,
    chat_template_source,
)
from exactdraft.loading.chat_template import render_chat_with_tools, template_supports_tools
from exactdraft.loading.tokenizer import Tokenizer
from exactdraft.server.tool_calls.formats import detect_format, parse_tool_calls
from tests.loading.test_chat_template_tools import CHAT as TOOLS_CHAT

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                           "hourly": {"type": "boolean"}},
                          "required": ["city"]}}
CALL = {"id": "call_7", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "hourly": True}}}
# The chat of test_chat_template_tools with a call that has a boolean argument.
CHAT = [*TOOLS_CHAT[:2], {"role": "assistant", "content": "", "tool_calls": [CALL]},
        *TOOLS_CHAT[3:]]
SIGNATURE = json.dumps(WEATHER)

GEMMA_EXPECTED = (
    "<s><start_of_turn>user\nBe brief.\n\nYou can call functions. To call one or more, write "
    "Python calls with keyword arguments inside a tool_code block, and nothing after it:\n"
    '```tool_code\nfunction_name(argument="value")\n```\nThe results come back in a '
    "tool_output block. The functions, one JSON object a line:\n" + SIGNATURE + "\n\n"
    "Weather in Paris?<end_of_turn>\n<start_of_turn>model\n```tool_code\n"
    'get_weather(city="Paris", hourly=True)\n```<end_of_turn>\n<start_of_turn>user\n'
    "```tool_output\nrain, 12 C\n```<end_of_turn>\n<start_of_turn>model\nIt rains.<end_of_turn>\n"
    "<start_of_turn>user\nAnd tomorrow?<end_of_turn>\n<start_of_turn>model\n")
CHATML_EXPECTED = (
    "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou can call functions. Their signatures, one "
    "JSON object a line, inside <tools></tools>:\n<tools>\n" + SIGNATURE + "\n</tools>\n\n"
    "To call a function, write a JSON object with its name and arguments inside "
    "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function name>, \"arguments\": "
    "<the arguments as a JSON object>}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "hourly": true}}\n</tool_call>'
    "<|im_end|>\n<|im_start|>user\n<tool_response>\nrain, 12 C\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nIt rains.<|im_end|>\n<|im_start|>user\nAnd tomorrow?<|im_end|>\n"
    "<|im_start|>assistant\n")
# (built-in, whole rendering, the first assistant turn's bounds, detected call format)
CASES = [("gemma", GEMMA_EXPECTED, "<start_of_turn>model\n", "<end_of_turn>", "gemma"),
         ("chatml", CHATML_EXPECTED, "<|im_start|>assistant\n", "<|im_end|>", "hermes")]


@pytest.fixture(scope="module")
def tokenizer_of(tiny_checkpoints):
    """A built-in's name or a template source -> a tiny checkpoint's tokenizer rendering it."""
    def make(value: str) -> Tokenizer:
        tokenizer = Tokenizer.from_folder(tiny_checkpoints["llama"])
        tokenizer.use_chat_template(chat_template_source(value))
        return tokenizer

    return make


def test_the_builtins_are_gemma_and_chatml_and_render_tools_natively():
    assert set(BUILTIN_TEMPLATES) == {"gemma", "chatml", "harmony"}
    assert all(template_supports_tools(source) for source in BUILTIN_TEMPLATES.values())


@pytest.mark.parametrize("name, expected, start, end, call_format", CASES)
def test_a_builtin_renders_system_tools_a_call_and_its_result(tokenizer_of, name, expected,
                                                              start, end, call_format):
    tokenizer = tokenizer_of(name)
    assert tokenizer.bos_token == "<s>"
    rendered = render_chat_with_tools(tokenizer, CHAT, [WEATHER])
    assert rendered == expected
    # The call the template wrote parses back in the format the server reads replies in.
    tool_format = detect_format(tokenizer.chat_template)
    assert tool_format.name == call_format
    turn = rendered.split(start)[1].split(end)[0]
    content, calls = parse_tool_calls(turn, tool_format, {"get_weather": WEATHER["parameters"]})
    assert content.strip() == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == \
        [("get_weather", {"city": "Paris", "hourly": True})]
    # Negative control: without tools nothing lists the function, the history stays.
    plain = render_chat_with_tools(tokenizer, CHAT, [])
    assert plain != rendered and SIGNATURE not in plain and "rain, 12 C" in plain


def test_a_plain_gemma_chat_renders_as_gemma_3_turns(tokenizer_of):
    tokenizer = tokenizer_of("gemma")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi "},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]
    assert tokenizer.render_chat(chat) == (
        "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        "Hello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    assert tokenizer.render_chat(chat[:2], add_generation_prompt=False).endswith(
        "Hi<end_of_turn>\n")


FILE_TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}[assistant] {% endif %}")


def test_a_template_file_or_text_works_through_from_pretrained(tiny_checkpoints, tmp_path):
    path = tmp_path / "chat.jinja"
    path.write_text(FILE_TEMPLATE)
    chat = [{"role": "user", "content": "hi"}]
    for value in (path, str(path), FILE_TEMPLATE):
        generator = xd.Generator.from_pretrained(tiny_checkpoints["llama"], chat_template=value,
                                                 progress=False)
        assert generator.tokenizer.render_chat(chat) == "[user] hi\n[assistant] "
    own = xd.Generator.from_pretrained(tiny_checkpoints["llama"], progress=False)
    assert own.tokenizer.render_chat(chat) != "[user] hi\n[assistant] "  # negative control
    generated = generator.generate(chat, max_new_tokens=3, temperature=0)
    expected = generator.generate(generator.tokenizer.encode("[user] hi\n[assistant] ",
                                                             add_special_tokens=False),
                                  max_new_tokens=3, temperature=0)
    assert generated.tokens == expected.tokens


@pytest.mark.parametrize("make, error, words", [
    (lambda tmp: "gemma4", ParameterError, "'gemma4' is neither a built-in template"),
    (lambda tmp: str(tmp / "missing.jinja"), ParameterError, "no such file"),
    (lambda tmp: str(tmp), ParameterError, "is a folder"),
    (lambda tmp: _written(tmp / "latin1.jinja", b"{{ caf\xe9 }}"), ParameterError,
     "is not UTF-8 text"),
    (lambda tmp: _written(tmp / "huge.jinja", b"x" * (MAX_TEMPLATE_BYTES + 1)), ParameterError,
     "is larger than"),
    (lambda tmp: _written(tmp / "broken.jinja", b"{% for m in messages %}"), TokenizerError,
     "does not compile"),
])
def test_a_bad_chat_template_is_refused_naming_it(tmp_path, make, error, words):
    value = make(tmp_path)
    with pytest.raises(error) as raised:
        chat_template_source(value)
    assert words in str(raised.value) and repr(value)[:40] in str(raised.value)


def _written(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_a_bad_chat_template_ends_the_command_before_loading(capsys):
    status = main(["generate", "/no/such/model.gguf", "--chat-template", "gemma4",
                   "--prompt", "hi"])
    assert status != 0
    message = capsys.readouterr().err
    assert "chat_template 'gemma4' is neither a built-in template" in message
    assert "no model" not in message  # refused before the model path was looked at
