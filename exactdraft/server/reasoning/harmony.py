"""Harmony's channels (gpt-oss): the reply is messages, each a header up to <|message|> and a
body up to <|end|>, <|return|> or <|call|>; the analysis channel is the reasoning.

    <|channel|>analysis<|message|>REASONING<|end|><|start|>assistant<|channel|>final
    <|message|>ANSWER<|return|>

Invariant (formats.py's): the pieces do not depend on how the text is cut. A header is read
once it is whole; an analysis body is Reasoning, a final or commentary body is Answer, each
without its markup. A message to a recipient (a tool call: `to=functions.NAME`) and anything
that is not Harmony markup go to the Answer as written, so the tool-call reader
(server/tool_calls/harmony.py) parses the calls and a model that writes plain text answers
with that text unchanged.
"""

from __future__ import annotations

import re

from exactdraft.server.reasoning.pieces import Answer, Piece, Reasoning, Splitter
from exactdraft.server.tool_calls.formats import held_back

START, CHANNEL, MESSAGE = "<|start|>assistant", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|return|>", "<|call|>")
HEADER_LIMIT = 256  # characters of a header before <|message|>; past it the text is plain
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


class HarmonySplitter(Splitter):
    def __init__(self) -> None:
        super().__init__("between")  # between messages, in a header, in a body, or plain text
        self.kind: str = "answer"  # the open body's: reasoning, answer or markup

    def _drain(self, final: bool) -> list[Piece]:
        while self.pending:
            if self.state == "between":
                if self.pending.startswith((START, CHANNEL)):
                    self.state = "header"
                elif not final and (START.startswith(self.pending) or
                                    CHANNEL.startswith(self.pending)):
                    break  # could still open a header
                else:
                    self.state = "plain"
            elif self.state == "header":
                # Only a <|message|> within HEADER_LIMIT counts, whole or streamed alike.
                at = self.pending.find(MESSAGE, 0, HEADER_LIMIT + len(MESSAGE))
                if at < 0:
                    if final or len(self.pending) >= HEADER_LIMIT + len(MESSAGE):
                        self.state = "plain"
                        continue
                    break
                self._open(self.pending[:at + len(MESSAGE)])
                self.pending = self.pending[at + len(MESSAGE):]
            elif self.state == "body":
                found = [(at, end) for end in ENDS if (at := self.pending.find(end)) >= 0]
                if found:
                    at, end = min(found)
                    self._body(self.pending[:at])
                    if self.kind == "reasoning":
                        self._span_closes(at + len(end))
                    if self.kind == "markup":
                        self.pieces.add(Answer, end)
                    self.pending, self.state = self.pending[at + len(end):], "between"
                    continue
                keep = 0 if final else held_back(self.pending, ENDS)
                self._body(self.pending[:len(self.pending) - keep])
                self.pending = self.pending[len(self.pending) - keep:]
                break
            else:
                self.pieces.add(Answer, self.pending)
                self.pending = ""
        return self.pieces.take()

    def _open(self, header: str) -> None:
        """Start a body after its whole header: its kind from the channel and recipient."""
        named = _CHANNEL_NAME.search(header)
        channel = named.group(1) if named else None
        if "to=" in header or channel not in ("analysis", "final", "commentary"):
            self.kind = "markup"  # a call (or an unknown channel): kept as written
            self.pieces.add(Answer, header)
        else:
            self.kind = "reasoning" if channel == "analysis" else "answer"
            if self.kind == "reasoning":  # the span starts with the header
                self._span_opens(0)
        self.state = "body"

    def _body(self, text: str) -> None:
        self.pieces.add(Reasoning if self.kind == "reasoning" else Answer, text)
