"""Stop handling and incremental text for a generation.

Invariant: whether a generation stops, and where, is decided from the committed tokens alone,
one token at a time, so drafted and serial runs stop at the same token. Streamed text is only
ever appended to: text that could still turn into a stop string, or that ends in an incomplete
UTF-8 sequence, is held back until it is settled, and the concatenation of every streamed piece
equals the final text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_INCOMPLETE = "\ufffd"


class StopMatcher:
    def __init__(self, stop_strings: str | Sequence[str], stop_tokens: Sequence[int],
                 tokenizer: Any | None) -> None:
        strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings or ())
        for value in strings:
            if not isinstance(value, str) or not value:
                raise ValueError(f"a stop string must be a non-empty str, got {value!r}")
        if strings and tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode text; pass stop_tokens "
                             "or build the Generator with a tokenizer")
        self.strings = strings
        self.tokens = {int(t) for t in stop_tokens}
        self.tokenizer = tokenizer
        self.matched: int | str | None = None
        self._text_end: int | None = None  # where the final text is cut (stop string start)
        self._streamed = 0  # characters of text already handed out
        self._checked = 0  # characters of text already searched for stop strings

    def _decode(self, tokens: Sequence[int]) -> str:
        if tokens and tokens[-1] in self.tokens and self.matched == tokens[-1]:
            tokens = tokens[:-1]
        return self.tokenizer.decode(list(tokens))

    def check(self, output: Sequence[int]) -> str | None:
        """'stop' if the last committed token ends the generation, else None."""
        if output[-1] in self.tokens:
            self.matched = output[-1]
            return "stop"
        if self.strings:
            text = self._decode(output)
            # A stop string not found before this token can only end inside its text.
            longest = max(len(s) for s in self.strings)
            search_from = max(0, self._checked - longest - 4)
            self._checked = len(text)
            hits = [(text.find(s, search_from), s) for s in self.strings]
            hits = [(at, s) for at, s in hits if at >= 0]
            if hits:
                at, string = min(hits)
                self.matched, self._text_end = string, at
                return "stop"
        return None

    def final_text(self, output: Sequence[int]) -> str | None:
        if self.tokenizer is None:
            return None
        text = self._decode(output)
        return text if self._text_end is None else text[:self._text_end]

    def new_text(self, output: Sequence[int], final: bool = False) -> str:
        """The text settled since the previous call."""
        if self.tokenizer is None:
            return ""
        if final:
            text = self.final_text(output)
        else:
            text = self._decode(output)
            end = len(text)
            while end and text[end - 1] == _INCOMPLETE:
                end -= 1
            held = 0
            for string in self.strings:
                for size in range(min(len(string) - 1, end), held, -1):
                    if text[end - size:end] == string[:size]:
                        held = size
                        break
            text = text[:end - held]
        piece = text[self._streamed:]
        self._streamed = max(self._streamed, len(text))
        return piece
