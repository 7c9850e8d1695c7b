"""The pieces a reasoning splitter turns text into (Reasoning and Answer, in the order the text
holds them) and what every splitter shares: text fed in deltas, held until settled, and
drained by the splitter's `_drain`.

Invariant: a piece is never empty; the pieces of a text, joined by kind, are its reasoning and
its answer (server/reasoning/formats.py). A splitter's `spans` are where the reasoning stands in
the text fed, its markup included (whole once `finish` has run): like the pieces, they do not
depend on how the text was cut.
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
    returns the pieces settled by then. `pending` is the text not yet settled; `fed` counts
    the characters fed; `spans` holds [start, end) character offsets of the reasoning in the
    text fed, markup included, the last one's end None while it is open."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.pending = ""
        self.pieces = Pieces()
        self.fed = 0
        self.spans: list[list[int | None]] = []

    def feed(self, text: str) -> list[Piece]:
        self.pending += text
        self.fed += len(text)
        return self._drain(final=False)

    def finish(self) -> list[Piece]:
        pieces = self._drain(final=True)
        if self.spans and self.spans[-1][1] is None:  # cut inside the reasoning
            self.spans[-1][1] = self.fed
        return pieces

    def _span_opens(self, index: int) -> None:
        """The reasoning starts at pending[index]."""
        self.spans.append([self.fed - len(self.pending) + index, None])

    def _span_closes(self, index: int) -> None:
        """The reasoning ends before pending[index] (its closing markup included)."""
        self.spans[-1][1] = self.fed - len(self.pending) + index

    def _drain(self, final: bool) -> list[Piece]:
        raise NotImplementedError
