"""The pieces a reasoning splitter turns text into: Reasoning and Answer, in the order the text
holds them.

Invariant: a piece is never empty; the pieces of a text, joined by kind, are its reasoning and
its answer (server/reasoning/formats.py).
"""

from __future__ import annotations

from dataclasses import dataclass

# Markup cut by a delta is held back by the rule the tool-call splitter holds its markers by:
# the longest end of the text that starts a marker.
from exactdraft.server.tool_calls.formats import _held_back as held_back  # noqa: F401


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
