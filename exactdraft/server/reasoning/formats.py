"""Reasoning formats: one table row per way a model writes its reasoning before its answer, and
the splitter of each row, which turns text deltas into Reasoning and Answer pieces.

Invariant: what a splitter emits depends only on the text, not on how it was cut into deltas:
feeding a text whole or in any pieces gives the same pieces once adjacent pieces of one kind
are joined. Markup that could still be the start of a marker is held back until it is settled,
and `finish` emits what is held back. The split removes only the row's markup: the text is
the markup put back around the reasoning and the answer (tests/server/reasoning). A template
that matches no row has no reasoning: the server then sends the text as it did without this
module.

Formats (FORMATS, checked in this order against a chat template's source by
`detect_reasoning`):

| name    | template / model        | reasoning                      | answer                 |
|---------|-------------------------|--------------------------------|------------------------|
| harmony | gpt-oss (Harmony)       | analysis channel messages      | final and commentary   |
|         |                         |                                | channels; calls kept as|
|         |                         |                                | markup for tool_calls/ |
| think   | Qwen3, QwQ, DeepSeek-R1,| <think> ... </think> opening   | the rest, less the     |
|         | GLM-4.5 (a template     | the reply, or from the start   | whitespace after       |
|         | naming </think>)        | when the prompt ends in <think>| </think>               |

A reply cut inside the reasoning (the length limit) is all reasoning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from exactdraft.server.reasoning.harmony import HarmonySplitter
from exactdraft.server.reasoning.pieces import Answer, Piece, Reasoning, Splitter
from exactdraft.server.tool_calls.formats import held_back

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
PROMPT_TAIL_TOKENS = 16  # prompt tokens decoded to see whether the prompt opened <think>


class ThinkSplitter(Splitter):
    """<think> ... </think>: `opened` says the prompt ended inside <think> (the reply starts in
    the reasoning); otherwise the reasoning is a <think> block that opens the reply (after
    whitespace). After </think> the whitespace before the answer is dropped."""

    def __init__(self, opened: bool) -> None:
        super().__init__("reasoning" if opened else "lead")
        if opened:
            self._span_opens(0)

    def _drain(self, final: bool) -> list[Piece]:
        while self.pending or final:
            if self.state == "lead":
                head = self.pending.lstrip()
                if head.startswith(THINK_OPEN):
                    self._span_opens(len(self.pending) - len(head))
                    self.pending, self.state = head[len(THINK_OPEN):], "reasoning"
                    continue
                if THINK_OPEN.startswith(head) and not final:
                    break  # the reply could still open with <think>
                self.state = "answer"
            elif self.state == "reasoning":
                at = self.pending.find(THINK_CLOSE)
                if at >= 0:
                    self.pieces.add(Reasoning, self.pending[:at])
                    self._span_closes(at + len(THINK_CLOSE))
                    self.pending, self.state = self.pending[at + len(THINK_CLOSE):], "gap"
                    continue
                keep = 0 if final else held_back(self.pending, (THINK_CLOSE,))
                self.pieces.add(Reasoning, self.pending[:len(self.pending) - keep])
                self.pending = self.pending[len(self.pending) - keep:]
                break
            elif self.state == "gap":
                self.pending = self.pending.lstrip()
                if not self.pending:
                    break
                self.state = "answer"
            else:
                self.pieces.add(Answer, self.pending)
                self.pending = ""
                break
        return self.pieces.take()


@dataclass(frozen=True)
class ReasoningFormat:
    """One row of the table: how to recognize the format in a chat template, and its splitter
    (given whether the prompt opened the reasoning)."""

    name: str
    detect: Callable[[str], bool]
    splitter: Callable[[bool], Splitter]


FORMATS: tuple[ReasoningFormat, ...] = (
    ReasoningFormat("harmony", lambda source: "<|channel|>" in source and "analysis" in source,
                    lambda opened: HarmonySplitter()),
    ReasoningFormat("think", lambda source: THINK_CLOSE in source, ThinkSplitter),
)


def detect_reasoning(template: str | None) -> ReasoningFormat | None:
    """The reasoning format a chat template's model writes, or None (no reasoning)."""
    for row in FORMATS:
        if template and row.detect(template):
            return row
    return None


def split_whole(splitter: Splitter, text: str) -> tuple[str, str]:
    """(reasoning, answer) of a whole text."""
    pieces = splitter.feed(text) + splitter.finish()
    return joined(pieces)


def joined(pieces: Sequence[Piece]) -> tuple[str, str]:
    """(reasoning, answer): the texts of each kind of piece, joined."""
    return ("".join(p.text for p in pieces if isinstance(p, Reasoning)),
            "".join(p.text for p in pieces if isinstance(p, Answer)))


def reasoning_splitters(tokenizer: Any, prompt_ids: Sequence[int],
                        separate: bool = True) -> Callable[[], Splitter] | None:
    """A maker of splitters for the replies to one prompt, or None when the reply's text goes
    out as it is (`separate` false, no tokenizer, or a template without reasoning)."""
    template = getattr(tokenizer, "chat_template", None)
    row = detect_reasoning(template) if separate else None
    if row is None:
        return None
    tail = tokenizer.decode(list(prompt_ids[-PROMPT_TAIL_TOKENS:]))
    opened = tail.rstrip().endswith(THINK_OPEN)
    return lambda: row.splitter(opened)


class StreamedReasoning:
    """One reply's splitter as its chunks come: (reasoning, answer) of each chunk."""

    def __init__(self, make: Callable[[], Splitter]) -> None:
        self.splitter = make()

    def pieces(self, text: str, final: bool) -> list[Piece]:
        return self.splitter.feed(text) + (self.splitter.finish() if final else [])

    def split(self, text: str, final: bool) -> tuple[str, str]:
        return joined(self.pieces(text, final))
