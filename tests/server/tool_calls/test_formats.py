"""Tool-call formats: each row's parser on text written as its models write it, the streaming
splitter fed the same text cut at every point (and one character at a time) giving the same
content and calls with no markup in the content, format detection from template sources, and
the constraint hook's grammars compiling in llguidance."""

from __future__ import annotations

import json
import random

import pytest

from exactdraft.server.tool_calls.formats import (
    FORMATS,
    CallArguments,
    CallEnd,
    CallStart,
    Content,
    ToolCall,
    ToolCallSplitter,
    collect,
    constraint_grammar,
    detect_format,
    format_named,
    parse_tool_calls,
)
from exactdraft.server.tool_calls.readers import ToolCallError

WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "days": {"type": "integer"}},
           "required": ["city"]}
TOOLS = {"get_weather": WEATHER, "now": None}

# (format, model text, content, [(name, arguments)]) as each format's models write calls.
SAMPLES = [
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
     '"Paris", "days": 2}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n'
     "</tool_call>",
     "Let me look.", [("get_weather", '{"city": "Paris", "days": 2}'), ("now", "{}")]),
    ("hermes", '<tool_call>{"arguments": {"city": "a}b\\"c"}, "name": "get_weather"}'
     "</tool_call>", "", [("get_weather", '{"city": "a}b\\"c"}')]),
    ("qwen3-xml", "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose, CA"
     "\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
     "Sure.", [("get_weather", '{"city": "San Jose, CA", "days": 3}')]),
    ("qwen3-xml", "<tool_call>\n<function=now>\n</function>\n</tool_call> done",
     " done", [("now", "{}")]),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
     '"id": "a1b2c3d4e"}, {"name": "now", "arguments": {}}]',
     "", [("get_weather", '{"city": "Paris"}'), ("now", "{}")]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "",
     [("get_weather", '{"city": "Paris"}')]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "",
     [("get_weather", '{"city": "Paris"}')]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}}; '
     '{"name": "now", "parameters": {}}', "",
     [("get_weather", '{"city": "Rome"}'), ("now", "{}")]),
    ("llama3", 'A {"name": "x"} is JSON.', 'A {"name": "x"} is JSON.', []),
    ("gemma", 'Checking.\n```tool_code\nget_weather(city="Paris", days=2)\n```\n',
     "Checking.", [("get_weather", '{"city": "Paris", "days": 2}')]),
    ("gemma", '```tool_code\n[get_weather(city="Oslo"), now()]\n```', "",
     [("get_weather", '{"city": "Oslo"}'), ("now", "{}")]),
    ("generic", 'I will call it. <tool_call>{"name": "get_weather", "arguments": '
     '{"city": "Lyon"}}</tool_call>', "I will call it.",
     [("get_weather", '{"city": "Lyon"}')]),
    ("generic", "No call here, only <tool_ and <b>text</b>.\n\n",
     "No call here, only <tool_ and <b>text</b>.\n\n", []),
    ("generic", 'A\n<tool_call>{"name": "now", "arguments": {}}</tool_call>\n\nB \n',
     "A\n\nB", [("now", "{}")]),
]


def run(tool_format, pieces, **options):
    """(events) of a splitter fed `pieces` then finished."""
    splitter = ToolCallSplitter(tool_format, TOOLS, **options)
    events = []
    for piece in pieces:
        events += splitter.feed(piece)
    return events + splitter.finish()


def check_events(events, content, calls):
    """The events make `content` and `calls`, each call's argument deltas concatenate to its
    arguments, every call starts before its deltas and ends after them, and no content event
    carries call markup."""
    assert collect(events) == (content, [ToolCall(f"call_{i}", n, a)
                                         for i, (n, a) in enumerate(calls)])
    streamed, started, ended = {}, set(), set()
    for event in events:
        if isinstance(event, CallStart):
            started.add(event.index)
        elif isinstance(event, CallArguments):
            assert event.index in started and event.index not in ended
            streamed[event.index] = streamed.get(event.index, "") + event.text
        elif isinstance(event, CallEnd):
            ended.add(event.index)
            assert event.arguments == streamed.get(event.index, "")
        elif isinstance(event, Content):
            for marker in ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "```tool_code",
                           "</tool_call>", "<function="):
                assert marker not in event.text
    assert started == ended == set(range(len(calls)))


@pytest.mark.parametrize("name, text, content, calls", SAMPLES,
                         ids=[f"{s[0]}-{i}" for i, s in enumerate(SAMPLES)])
def test_each_format_parses_its_calls_from_any_cut_of_the_text(name, text, content, calls):
    tool_format = format_named(name)
    assert parse_tool_calls(text, tool_format, TOOLS) == \
        (content, [ToolCall(f"call_{i}", n, a) for i, (n, a) in enumerate(calls)])
    for arguments in (a for _, a in calls):
        assert isinstance(json.loads(arguments), dict)
    check_events(run(tool_format, [text]), content, calls)
    check_events(run(tool_format, list(text)), content, calls)
    for cut in range(len(text) + 1):
        check_events(run(tool_format, [text[:cut], text[cut:]]), content, calls)
    rng = random.Random(len(text))
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), 4))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        check_events(run(tool_format, pieces), content, calls)


def test_a_call_goes_out_once_it_ends():
    """A call's events wait for its end, so a stream never carries a call that does not
    complete; the end releases them in order (the start, the arguments as written, the end)."""
    splitter = ToolCallSplitter(format_named("hermes"), TOOLS)
    assert splitter.feed('Hi <tool_call>{"name": "get_weather", "arguments": {"city": "Par') \
        == [Content("Hi")]
    events = splitter.feed('is"}}</tool_call>')
    assert events[0] == CallStart(0, "call_0", "get_weather")
    assert events[-1] == CallEnd(0, '{"city": "Paris"}', True)
    assert "".join(e.text for e in events[1:-1]) == '{"city": "Paris"}'
    assert all(isinstance(e, CallArguments) for e in events[1:-1])


def test_content_that_could_open_a_call_is_held_back_until_settled():
    splitter = ToolCallSplitter(format_named("hermes"), TOOLS)
    assert splitter.feed("Hello <tool") == [Content("Hello")]
    assert splitter.feed("box>") == [Content(" <toolbox>")]
    llama = ToolCallSplitter(format_named("llama3"), TOOLS)
    assert llama.feed('  {"na') == []  # a reply opening with {"name" is a call
    assert llama.feed("tion") == [Content('  {"nation')]


BROKEN = [
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": Paris}}</tool_call>',
     "tool call 0 (get_weather) is not valid JSON"),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
     "not an object"),
    ("hermes", '<tool_call>{"name": "launch", "arguments": {}}</tool_call>',
     "'launch', which is not one of the tools"),
    ("hermes", "<tool_call>get_weather(city='Paris')</tool_call>", "not a JSON object"),
    ("hermes", '<tool_call>{"name": "now", "arguments": {}} oops</tool_call>',
     "expected '</tool_call>'"),
    ("qwen3-xml", "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n"
     "</parameter>\n</function>\n</tool_call>", "parameter 'days' is not a integer"),
    ("mistral", '[TOOL_CALLS][{"name": "now", "arguments": {}} {"name": "now"}]',
     "instead of ',' or ']'"),
    ("gemma", "```tool_code\nimport os\n```", "not Python calls"),
    ("gemma", "```tool_code\nget_weather(city=open('x'))\n```", "is not a literal"),
    ("generic", '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo",}}'
     "</tool_call>", "tool call 0 (get_weather) is not valid JSON"),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": [1]}', "not an object"),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": Oslo}', "not JSON"),
]


@pytest.mark.parametrize("name, text, message", BROKEN)
def test_markup_that_does_not_parse_raises_naming_the_call_when_strict(name, text, message):
    with pytest.raises(ToolCallError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_tool_calls(text, format_named(name), TOOLS, strict=True)


@pytest.mark.parametrize("name, text, message", BROKEN)
def test_a_broken_call_and_the_text_after_it_are_content(name, text, message, caplog):
    """A call that does not parse is sent as the model wrote it: from its start marker (with
    the whitespace before it) the text is content, whole or fed in any pieces, and the reason
    is logged; a call before it stays a call. Control: the strict splitter raises on the same
    text (the test above)."""
    tool_format = format_named(name)
    good = {"hermes": '<tool_call>{"name": "now", "arguments": {}}</tool_call>',
            "qwen3-xml": "<tool_call>\n<function=now>\n</function>\n</tool_call>",
            "gemma": "```tool_code\nnow()\n```"}.get(name)
    whole = "Hi. " + text + "\nafter"
    cases = [(whole, whole, [])]
    if good is not None:
        cases.append(("Hi. " + good + "\n" + text + " after", "Hi.\n" + text + " after",
                      [("now", "{}")]))
    for full, content, calls in cases:
        caplog.clear()
        expected = parse_tool_calls(full, tool_format, TOOLS)
        assert expected[0] == content
        assert [(c.name, c.arguments) for c in expected[1]] == calls
        reason = message.replace("tool call 0 ", "")  # the second case's call is call 1
        assert any(reason in record.getMessage() for record in caplog.records
                   if record.name == "exactdraft.server.tool_calls"), caplog.records
        cut = random.Random(len(full)).sample(range(1, len(full)), 5)
        bounds = [0, *sorted(cut), len(full)]
        for pieces in (list(full), [full[a:b] for a, b in zip(bounds, bounds[1:])]):
            assert collect(run(tool_format, pieces)) == expected


def test_a_broken_call_past_the_call_limit_is_dropped_as_a_good_one_is():
    """With one call allowed (parallel_tool_calls false), a second call naming an unknown
    function is dropped as a second good call is, not turned into content; one whose
    arguments do not parse is still a broken call. Control: without the limit the unknown
    name is a broken call."""
    hermes = format_named("hermes")
    first = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    unknown = '\n<tool_call>{"name": "launch", "arguments": {}}</tool_call>'
    assert parse_tool_calls(first + unknown, hermes, TOOLS, max_calls=1) == \
        parse_tool_calls(first + first, hermes, TOOLS, max_calls=1) == \
        ("", [ToolCall("call_0", "now", "{}")])
    assert parse_tool_calls(first + unknown, hermes, TOOLS) == \
        (unknown, [ToolCall("call_0", "now", "{}")])
    broken = '\n<tool_call>{"name": "now", "arguments": {x}}</tool_call>'
    assert parse_tool_calls(first + broken, hermes, TOOLS, max_calls=1) == \
        (broken, [ToolCall("call_0", "now", "{}")])


def test_a_broken_call_then_a_cut_stays_content():
    """A text cut by the length limit after a broken call keeps all of it as content."""
    text = 'A <tool_call>{"name": "now", "arguments": [1]}</tool_call> and <tool_c'
    for pieces in ([text], list(text)):
        splitter = ToolCallSplitter(format_named("generic"), TOOLS)
        events = [e for piece in pieces for e in splitter.feed(piece)]
        assert collect(events + splitter.finish(cut=True)) == (text, [])


MARKERS = [marker for row in FORMATS for marker in row.markers]


@pytest.mark.parametrize("name, text, content, calls", SAMPLES,
                         ids=[f"{s[0]}-{i}" for i, s in enumerate(SAMPLES)])
def test_a_text_cut_anywhere_gives_only_whole_calls_and_no_markup(name, text, content, calls):
    """Every prefix of a well-formed text, as the length limit cuts it: no error, the calls
    are the whole text's first calls with arguments that parse, a call the cut falls inside is
    gone (no partial arguments), and the content is the whole content's start with no piece of
    a start marker at its end."""
    tool_format = format_named(name)
    whole = [ToolCall(f"call_{i}", n, a) for i, (n, a) in enumerate(calls)]
    inside = 0  # prefixes cut inside a call's markup (the control: the cuts reach a call)
    for cut in range(len(text) + 1):
        got_content, got_calls = parse_tool_calls(text[:cut], tool_format, TOOLS, cut=True)
        assert got_calls == whole[:len(got_calls)], (cut, got_calls)
        assert all(isinstance(json.loads(c.arguments), dict) for c in got_calls)
        assert content.startswith(got_content) or got_content.rstrip() == content, cut
        assert not any(marker.startswith(got_content[-size:]) for marker in MARKERS
                       for size in range(1, len(marker)) if len(got_content) >= size), cut
        streamed = collect(run_cut(tool_format, list(text[:cut])))
        assert streamed == (got_content, got_calls), cut
        inside += len(got_calls) < len(whole) and got_content.strip() != text[:cut].strip()
    assert inside > 0 or not calls


def run_cut(tool_format, pieces):
    """The events of a splitter fed `pieces`, finished as cut by the length limit."""
    splitter = ToolCallSplitter(tool_format, TOOLS)
    events = [e for piece in pieces for e in splitter.feed(piece)]
    return events + splitter.finish(cut=True)


def test_a_text_cut_inside_a_call_drops_it():
    text = 'A <tool_call>{"name": "get_weather", "arguments": {"city": "Pa'
    assert parse_tool_calls(text, format_named("generic"), TOOLS) == ("A", [])
    assert parse_tool_calls(text, format_named("generic"), TOOLS, cut=True) == ("A", [])
    assert parse_tool_calls("<tool_call>", format_named("generic"), TOOLS) == ("", [])
    # A start marker cut short is dropped with its whitespace when the length limit cut it;
    # at a natural end it is text (control).
    assert parse_tool_calls("Sure.\n<tool_", format_named("generic"), TOOLS, cut=True) == \
        ("Sure.", [])
    assert parse_tool_calls("Sure.\n<tool_", format_named("generic"), TOOLS) == \
        ("Sure.\n<tool_", [])
    # A closing tag cut short: the call was whole.
    done = '<tool_call>{"name": "now", "arguments": {}}</tool_call'
    assert parse_tool_calls(done, format_named("generic"), TOOLS, cut=True) == \
        ("", [ToolCall("call_0", "now", "{}")])


def test_max_calls_drops_the_later_calls_and_their_markup():
    text = ('<tool_call>{"name": "now", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "X"}}</tool_call>ok')
    assert parse_tool_calls(text, format_named("generic"), TOOLS, max_calls=1) == \
        ("ok", [ToolCall("call_0", "now", "{}")])
    assert len(parse_tool_calls(text, format_named("generic"), TOOLS)[1]) == 2


TEMPLATES = {
    "qwen3-xml": "{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>\n"
                 "<function=...><parameter=...>{% for m in messages %}{{ m.tool_calls }}"
                 "{% endfor %}",
    "hermes": "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
              "{% endif %}{% for m in messages %}{% for c in m.tool_calls %}<tool_call>"
              "{% endfor %}{% endfor %}",
    "mistral": "{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]{% endif %}{% endfor %}"
               "{% if tools %}[AVAILABLE_TOOLS]{% endif %}",
    "llama3": "<|start_header_id|>{% if tools %}{{ tools }} \"parameters\"{% endif %}"
              "{% for m in messages %}{{ m.tool_calls }}<|python_tag|>{% endfor %}",
    "generic": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>"
               "{% endfor %}",
}


@pytest.mark.parametrize("expected", sorted(TEMPLATES))
def test_the_format_is_detected_from_the_template_source(expected):
    assert detect_format(TEMPLATES[expected]).name == expected


def test_a_template_naming_markup_without_rendering_tools_gets_the_generic_format():
    """Mentioning <tool_call> is not enough: the template must render tools and the calls."""
    assert detect_format("<tool_call>{% for m in messages %}{{ m.content }}{% endfor %}").name \
        == "generic"
    assert detect_format(None).name == "generic"
    assert [row.name for row in FORMATS][-1] == "generic"


FUNCTIONS = [{"name": "get_weather", "parameters": WEATHER, "strict": True},
             {"name": "now", "parameters": {"type": "object"}}]


@pytest.mark.parametrize("name, choice, parallel", [
    ("generic", "required", True), ("generic", "get_weather", False),
    ("generic", "auto", True), ("hermes", "now", True), ("mistral", "required", True),
    ("llama3", "get_weather", False)])
def test_constraint_grammars_compile_in_llguidance(name, choice, parallel):
    llguidance = pytest.importorskip("llguidance")
    grammar = constraint_grammar(format_named(name), FUNCTIONS, choice, parallel)
    assert grammar is not None
    assert llguidance.LLMatcher.validate_grammar(
        llguidance.grammar_from("lark", grammar)) == ""
    if choice not in ("required", "auto"):  # a named choice allows that function only
        assert '"name": \\"now\\"' not in grammar or choice == "now"
        assert f'\\"{choice}\\"' in grammar


def test_a_broken_grammar_is_caught_by_the_validation_above():
    """Negative control for the compile check: llguidance reports an error for a bad rule."""
    llguidance = pytest.importorskip("llguidance")
    grammar = constraint_grammar(format_named("generic"), FUNCTIONS, "required", True)
    assert llguidance.LLMatcher.validate_grammar(
        llguidance.grammar_from("lark", grammar.replace("%json", "%jsn"))) != ""


def test_free_output_has_no_grammar():
    generic = format_named("generic")
    assert constraint_grammar(generic, FUNCTIONS[1:], "auto", True) is None  # nothing strict
    assert constraint_grammar(generic, FUNCTIONS, "none", True) is None
    assert constraint_grammar(format_named("gemma"), FUNCTIONS, "required", True) is None


@pytest.fixture(scope="module")
def byte_matcher():
    """matcher(grammar, text) -> whether llguidance's matcher accepts `text` whole, over a
    tokenizer with one token per byte (so any text is a token sequence)."""
    llguidance = pytest.importorskip("llguidance")
    pytest.importorskip("llguidance.hf")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    vocab["</s>"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["</s>"])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
    tokenizer = llguidance.hf.from_tokenizer(fast)

    def accepts(grammar: str, text: str) -> bool:
        matcher = llguidance.LLMatcher(tokenizer, llguidance.grammar_from("lark", grammar))
        for token in fast.encode(text, add_special_tokens=False):
            if not matcher.consume_token(token):
                return False
        return matcher.is_accepting()

    return accepts


CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.mark.parametrize("choice, text, accepted", [
    ("required", CALL, True),
    ("required", CALL + "\n" + '<tool_call>{"name": "now", "arguments": {}}</tool_call>', True),
    ("required", "It is sunny.", False),
    ("required", CALL.replace("city", "town"), False),  # the schema requires city
    ("required", CALL.replace("get_weather", "launch"), False),
    ("get_weather", CALL, True),
    ("now", CALL, False),
    ("auto", "It is sunny.", True),
    ("auto", "Let me check. " + CALL, True),
    ("auto", "Let me check. " + CALL.replace('"Paris"', "7"), False),  # strict: typed
    ("auto", 'a <tool_call>{"name": "now", "arguments": {"any": 1}}</tool_call> b', True),
    ("auto", "a " + CALL.replace("get_weather", "launch"), False),
    ("auto", "a <tool_ b < c", True),
])
def test_the_grammar_accepts_exactly_the_calls_the_request_allows(byte_matcher, choice, text,
                                                                  accepted):
    """The generic format's grammars."""
    grammar = constraint_grammar(format_named("generic"), FUNCTIONS, choice, True)
    assert byte_matcher(grammar, text) is accepted
    if accepted:  # and what it accepts, the generic parser reads
        parse_tool_calls(text, format_named("generic"), TOOLS)


@pytest.mark.parametrize("name, text", [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
               "</tool_call>"),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}')])
def test_each_format_grammar_accepts_calls_written_as_its_models_write_them(byte_matcher, name,
                                                                           text):
    tool_format = format_named(name)
    grammar = constraint_grammar(tool_format, FUNCTIONS, "required", True)
    assert byte_matcher(grammar, text)
    assert not byte_matcher(grammar, text.replace('"Paris"', "7"))  # city must be a string
    assert parse_tool_calls(text, tool_format, TOOLS)[1][0].name == "get_weather"
