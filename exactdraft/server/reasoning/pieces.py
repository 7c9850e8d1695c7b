"""The pieces a reasoning splitter turns text into (Reasoning and Answer, in the order the text
holds them) and what every splitter shares: text fed in deltas, held until settled, and
drained by the splitter's `_drain`.

Invariant: a piece is never empty; the pieces of a text, joined by kind, are its reasoning and
its answer (server/reasoning/formats.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class Answer:
    text: str


Piece = Reasoning | Answer


class Pieces:
    """The pieces a splitter emits, empty ones left out."""

    def __init__(self) -> None:
        self.found: list[Piece] = []

    def add(self, kind: type, text: str) -> None:
        if text:
            self.found.append(kind(text))

    def take(self) -> list[Piece]:
        found, self.found = self.found, []
        return found


class Splitter:
    """A reasoning splitter: `feed` takes the next delta, `finish` the end of the text; each
    returns the pieces settled by then. `pending` is the text not yet settled."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.pending = ""
        self.pieces = Pieces()

    def feed(self, text: str) -> list[Piece]:
        self.pending += text
        return self._drain(final=False)

    def finish(self) -> list[Piece]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[Piece]:
        raise NotImplementedError
