"""Reasoning formats: each row's splitter on text written as its models write it, fed whole,
one character at a time and cut at every point, giving the same reasoning and answer; the text
is the row's markup put back around them; detection from template sources (a template without
reasoning gets no row)."""

from __future__ import annotations

import re

import pytest

from exactdraft.loading.builtin_templates import chat_template_source
from exactdraft.server.reasoning.formats import (
    FORMATS,
    ThinkSplitter,
    detect_reasoning,
    joined,
    split_whole,
)
from exactdraft.server.reasoning.harmony import HEADER_LIMIT, HarmonySplitter

CALL = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json'
        '<|message|>{"city": "Paris"}<|call|>')

LONG_HEADER = "<|channel|>analysis" + " " * HEADER_LIMIT + "<|message|>think<|end|>"

# (splitter maker, text, reasoning, answer)
SAMPLES = [
    (lambda: ThinkSplitter(False), "<think>\nThe user greets.\n</think>\n\nHello!",
     "\nThe user greets.\n", "Hello!"),
    (lambda: ThinkSplitter(False), "  \n<think>a < b </thin</think>x", "a < b </thin", "x"),
    (lambda: ThinkSplitter(False), "No reasoning, <think> in the middle.", "",
     "No reasoning, <think> in the middle."),
    (lambda: ThinkSplitter(False), "  <thin", "", "  <thin"),  # the end: a prefix is text
    (lambda: ThinkSplitter(False), "<think>cut by the length limit", "cut by the length limit",
     ""),
    (lambda: ThinkSplitter(True), "Opened by the prompt.</think>\nAnswer.",
     "Opened by the prompt.", "Answer."),
    (lambda: ThinkSplitter(True), "All reasoning, never closed", "All reasoning, never closed",
     ""),
    (HarmonySplitter, "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
     "<|channel|>final<|message|>It rains.<|return|>", "Need the weather.", "It rains."),
    (HarmonySplitter, "<|channel|>analysis<|message|>Call it.<|end|>" + CALL, "Call it.", CALL),
    (HarmonySplitter, "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
     "<|channel|>final<|message|>Done", "", "Checking.Done"),
    (HarmonySplitter, "<|channel|>analysis<|message|>cut <|en", "cut <|en", ""),
    (HarmonySplitter, "Plain text with <|channel|> inside.", "",
     "Plain text with <|channel|> inside."),
    (HarmonySplitter, "<|chan", "", "<|chan"),
    # A header past HEADER_LIMIT characters is plain text, however the text is cut.
    (HarmonySplitter, LONG_HEADER, "", LONG_HEADER),
    (HarmonySplitter, LONG_HEADER[:20] + LONG_HEADER[-25:], "think", ""),
]


@pytest.mark.parametrize("make, text, reasoning, answer", SAMPLES)
def test_each_splitter_gives_the_same_split_from_any_cut(make, text, reasoning, answer):
    assert split_whole(make(), text) == (reasoning, answer)
    for pieces in ([text], list(text), *([text[:cut], text[cut:]]
                                          for cut in range(len(text) + 1))):
        splitter = make()
        found = [piece for part in pieces for piece in splitter.feed(part)] + splitter.finish()
        assert joined(found) == (reasoning, answer), pieces


def test_the_think_markup_put_back_is_the_text():
    for make, text, reasoning, answer in SAMPLES:
        if make().__class__ is not ThinkSplitter or "<think>" not in text.lstrip()[:7]:
            continue
        match = re.fullmatch(r"\s*<think>(.*?)(?:</think>\s*(.*))?", text, re.S)
        assert (match.group(1), match.group(2) or "") == (reasoning, answer)


def test_a_split_that_would_differ_is_seen():
    """Negative control for the cut check above: a splitter that answers per piece (no
    holding back) gives another split for a cut inside the marker."""
    text = "<think>a</think>b"
    whole = split_whole(ThinkSplitter(False), text)
    first, second = ThinkSplitter(False), ThinkSplitter(False)
    pieces = first.feed(text[:10]) + first.finish() + second.feed(text[10:]) + second.finish()
    assert joined(pieces) != whole


def test_the_format_is_detected_from_the_template_source():
    assert detect_reasoning(chat_template_source("harmony")).name == "harmony"
    qwen3 = ("{%- if message.role == 'assistant' %}{%- set content = message.content.split("
             "'</think>')[-1] %}{{ '<think>\\n' + reasoning_content + '\\n</think>' }}")
    assert detect_reasoning(qwen3).name == "think"
    for plain in (chat_template_source("chatml"), chat_template_source("gemma"), None, ""):
        assert detect_reasoning(plain) is None
    assert [row.name for row in FORMATS] == ["harmony", "think"]


def spans_of(make, parts: list[str]) -> list[list[int]]:
    splitter = make()
    for part in parts:
        splitter.feed(part)
    splitter.finish()
    return splitter.spans


# (splitter maker, text, the text of each reasoning span: markup included)
SPANS = [
    (lambda: ThinkSplitter(False), "  <think>a</think>\n\nb", ["<think>a</think>"]),
    (lambda: ThinkSplitter(False), "<think>cut", ["<think>cut"]),
    (lambda: ThinkSplitter(False), "b <think>a</think>", []),
    (lambda: ThinkSplitter(True), "a</think>b", ["a</think>"]),
    (HarmonySplitter, "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final"
     "<|message|>b<|return|>", ["<|channel|>analysis<|message|>a<|end|>"]),
    (HarmonySplitter, "<|channel|>analysis<|message|>a<|end|>" + CALL,
     ["<|channel|>analysis<|message|>a<|end|>"]),
    (HarmonySplitter, "<|channel|>final<|message|>b<|end|><|start|>assistant<|channel|>analysis"
     "<|message|>cut <|en", ["<|start|>assistant<|channel|>analysis<|message|>cut <|en"]),
    (HarmonySplitter, LONG_HEADER, []),
]


@pytest.mark.parametrize("make, text, spans", SPANS)
def test_the_reasoning_spans_hold_its_markup_from_any_cut(make, text, spans):
    whole = spans_of(make, [text])
    assert [text[start:end] for start, end in whole] == spans
    for parts in (list(text), *([text[:cut], text[cut:]] for cut in range(len(text) + 1))):
        assert spans_of(make, parts) == whole, parts
