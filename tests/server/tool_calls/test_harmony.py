"""The Harmony tool-call row (gpt-oss): calls in either header form parse from any cut of the
text with no call markup left in the content, a text cut inside a call drops it, markup that
does not parse raises naming the call; the built-in `harmony` template renders a chat with
tools, a call and its result exactly, its call parsing back in the format detected from it; and
the grammar of a forced call accepts exactly the calls tool_choice allows, reasoning first or
not."""

from __future__ import annotations

import json

import pytest

from exactdraft.loading.builtin_templates import chat_template_source
from exactdraft.loading.chat_template import render_chat_with_tools
from exactdraft.loading.tokenizer import Tokenizer
from exactdraft.server.reasoning.formats import split_whole
from exactdraft.server.reasoning.harmony import HarmonySplitter
from exactdraft.server.tool_calls.formats import (
    ToolCall,
    constraint_grammar,
    detect_format,
    format_named,
    parse_tool_calls,
)
from exactdraft.server.tool_calls.harmony import HEADER_LIMIT, MARKERS
from exactdraft.server.tool_calls.readers import ToolCallError
from tests.loading.test_builtin_templates import CHAT, WEATHER
from tests.server.tool_calls.test_formats import (  # noqa: F401 (a fixture)
    TOOLS,
    byte_matcher,
    check_events,
    run,
)

ANALYSIS = "<|channel|>analysis<|message|>Need the weather tool.<|end|>"
CALL = ("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris", "days": 2}<|call|>')
SAMPLES = [
    (ANALYSIS + CALL, ANALYSIS, [("get_weather", '{"city": "Paris", "days": 2}')]),
    # The call opens the reply, <|call|> (a stop token) is not in the text.
    ('<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}', "",
     [("now", "{}")]),
    # The recipient in the role header, two calls in a row.
    ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>'
     '{"city": "a}b\\"c"}<|call|>' + CALL, "",
     [("get_weather", '{"city": "a}b\\"c"}'), ("get_weather", '{"city": "Paris", "days": 2}')]),
    ("<|channel|>final<|message|>No call: to=functions is just text.<|return|>",
     "<|channel|>final<|message|>No call: to=functions is just text.<|return|>", []),
]


@pytest.mark.parametrize("text, content, calls", SAMPLES)
def test_calls_parse_from_any_cut_with_no_markup_in_the_content(text, content, calls):
    harmony = format_named("harmony")
    assert parse_tool_calls(text, harmony, TOOLS) == \
        (content, [ToolCall(f"call_{i}", n, a) for i, (n, a) in enumerate(calls)])
    for pieces in ([text], list(text), *([text[:cut], text[cut:]]
                                          for cut in range(len(text) + 1))):
        events = run(harmony, pieces)
        check_events(events, content, calls)
        assert not any(marker in getattr(event, "text", "") for event in events
                       for marker in (*MARKERS, "<|constrain|>", "<|call|>"))


def test_a_text_cut_inside_a_call_drops_it():
    harmony = format_named("harmony")
    text = ANALYSIS + CALL
    dropped = 0
    for cut in range(len(ANALYSIS) + 1, len(text) - len("<|call|>")):
        content, calls = parse_tool_calls(text[:cut], harmony, TOOLS, cut=True)
        dropped += calls == []
        assert calls in ([], [ToolCall("call_0", "get_weather", '{"city": "Paris", '
                                                                '"days": 2}')])
        assert "to=functions" not in content
    assert dropped > 0


@pytest.mark.parametrize("text, message", [
    ("<|channel|>commentary to=functions.get weather<|message|>{}", "header"),
    ("<|channel|>commentary to=functions.now <|constrain|>json<|message|>[1]", "not an object"),
    ("<|channel|>commentary to=functions.now <|constrain|>json<|message|>{} and more",
     "expected"),
    ("<|channel|>commentary to=functions.delete_all <|constrain|>json<|message|>{}",
     "delete_all"),
])
def test_markup_that_does_not_parse_raises_naming_the_call_when_strict(text, message):
    with pytest.raises(ToolCallError, match=message):
        parse_tool_calls(text, format_named("harmony"), TOOLS, strict=True)
    # Not strict: the call is content as written, with the text around it, however fed.
    whole = "Hi " + text + " end"
    assert parse_tool_calls(whole, format_named("harmony"), TOOLS) == (whole, [])
    check_events(run(format_named("harmony"), list(whole)), whole, [])


def test_a_header_past_the_limit_is_refused_whole_or_streamed():
    """A <|message|> later than HEADER_LIMIT characters after the marker ends no header, however
    the text is cut (a whole text used to read it as a call); one within the limit does."""
    harmony = format_named("harmony")
    head = "<|channel|>commentary to=functions.now"
    for spaces, refused in ((HEADER_LIMIT - len("now"), False),
                            (HEADER_LIMIT - len("now") + 1, True)):
        text = head + " " * spaces + "<|message|>{}"
        for pieces in ([text], list(text), [text[:200], text[200:]]):
            if refused:
                with pytest.raises(ToolCallError, match="no <\\|message\\|> within 256"):
                    run(harmony, pieces, strict=True)
                check_events(run(harmony, pieces), text, [])
            else:
                check_events(run(harmony, pieces), "", [("now", "{}")])


HARMONY_EXPECTED = (
    "<|start|>system<|message|>Reasoning: medium\n\n# Valid channels: analysis, commentary, "
    "final. Channel must be included for every message.\nCalls to these tools must go to the "
    "commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions\n\n"
    "Be brief.\n\n# Tools\n\n## functions\n\nnamespace functions {\n\n"
    "// The weather in a city\ntype get_weather = (_: {\ncity: string,\nhourly?: boolean,\n"
    "}) => any;\n\n} // namespace functions<|end|>"
    "<|start|>user<|message|>Weather in Paris?<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris", "hourly": true}<|call|>'
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>rain, 12 C"
    "<|end|><|start|>assistant<|channel|>final<|message|>It rains.<|end|>"
    "<|start|>user<|message|>And tomorrow?<|end|><|start|>assistant")


def test_the_builtin_renders_harmony_turns_and_its_call_parses_back(tiny_checkpoints):
    tokenizer = Tokenizer.from_folder(tiny_checkpoints["llama"])
    tokenizer.use_chat_template(chat_template_source("harmony"))
    rendered = render_chat_with_tools(tokenizer, CHAT, [WEATHER])
    assert rendered == HARMONY_EXPECTED
    tool_format = detect_format(tokenizer.chat_template)
    assert tool_format.name == "harmony"
    turn = rendered.split("Weather in Paris?<|end|>")[1].split("<|start|>functions.")[0]
    content, calls = parse_tool_calls(turn, tool_format, {"get_weather": WEATHER["parameters"]})
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in calls] == \
        [("get_weather", {"city": "Paris", "hourly": True})]
    # Negative control: without tools nothing lists the function, the history stays.
    plain = render_chat_with_tools(tokenizer, CHAT, [])
    assert "namespace functions" not in plain and "rain, 12 C" in plain
    # A tool result without a name takes the name of the call it answers.
    unnamed = [{key: value for key, value in message.items() if key != "name"}
               for message in CHAT]
    assert render_chat_with_tools(tokenizer, unnamed, [WEATHER]) == HARMONY_EXPECTED


FUNCTIONS = [{"name": "get_weather", "parameters": TOOLS["get_weather"]},
             {"name": "now", "parameters": {"type": "object"}}]
FORCED = ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
          '{"city": "Paris", "days": 2}<|call|>')
NOW = "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}<|call|>"


@pytest.mark.parametrize("choice, parallel, text, accepted", [
    ("get_weather", False, FORCED, True),
    ("get_weather", False, "<|channel|>analysis<|message|>Use the tool.<|end|>"
     "<|start|>assistant" + FORCED, True),
    ("get_weather", False, NOW, False),  # a named choice: that function only
    ("get_weather", False, FORCED.replace('"Paris"', "7"), False),  # city is a string
    ("get_weather", False, "<|channel|>final<|message|>It rains.<|return|>", False),
    ("get_weather", False, FORCED + "<|start|>assistant" + FORCED, False),  # one call
    ("required", True, FORCED + "<|start|>assistant" + NOW, True),
    ("required", False, NOW, True),
    ("required", True, "It rains.", False),
])
def test_a_forced_call_grammar_accepts_exactly_the_calls_allowed(
        byte_matcher, choice, parallel, text, accepted):  # noqa: F811 (the fixture)
    harmony = format_named("harmony")
    grammar = constraint_grammar(harmony, FUNCTIONS, choice, parallel)
    assert byte_matcher(grammar, text) is accepted
    if accepted:  # and what it accepts, the reasoning splitter and the call reader read
        reasoning, answer = split_whole(HarmonySplitter(), text)
        content, calls = parse_tool_calls(answer, harmony, TOOLS)
        assert content == "" and calls and all(c.name in TOOLS for c in calls)
        assert reasoning == ("Use the tool." if "analysis" in text else "")


def test_harmony_grammars_compile_and_free_choices_have_none():
    llguidance = pytest.importorskip("llguidance")
    harmony = format_named("harmony")
    for choice, parallel in (("required", True), ("now", False)):
        grammar = constraint_grammar(harmony, FUNCTIONS, choice, parallel)
        assert llguidance.LLMatcher.validate_grammar(
            llguidance.grammar_from("lark", grammar)) == ""
    assert constraint_grammar(harmony, FUNCTIONS, "auto", True) is None
    assert constraint_grammar(harmony, FUNCTIONS, "none", True) is None
    with pytest.raises(ToolCallError, match="launch"):
        constraint_grammar(harmony, FUNCTIONS, "launch", False)
