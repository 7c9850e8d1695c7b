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

import numpy as np

from exactdraft.errors import ParameterError
from exactdraft.prompts import check_text

INCOMPLETE = "\ufffd"  # what a decoder writes for bytes a later token completes


def check_stop_tokens(stop_tokens: Sequence[int], vocab_size: int | None) -> list[int]:
    """The stop token ids as ints, each checked to be an id inside the vocabulary."""
    if isinstance(stop_tokens, (str, bytes, int, np.integer)) or \
            not isinstance(stop_tokens, (Sequence, set, frozenset, np.ndarray)):
        raise ParameterError(f"stop_tokens must be a list of token ids, got "
                             f"{type(stop_tokens).__name__} {stop_tokens!r}")
    tokens = list(stop_tokens)
    for value in tokens:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ParameterError(f"stop token {value!r} is not a token id")
        if value < 0 or (vocab_size is not None and value >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise ParameterError(f"stop token id {value} is outside the vocabulary {bound}")
    return [int(t) for t in tokens]


class StopMatcher:
    def __init__(self, stop_strings: str | Sequence[str], stop_tokens: Sequence[int],
                 tokenizer: Any | None, vocab_size: int | None = None) -> None:
        if stop_strings is not None and not isinstance(stop_strings, (str, Sequence)):
            raise ParameterError(f"stop must be a str or a list of str, got "
                                 f"{type(stop_strings).__name__} {stop_strings!r}")
        strings = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings or ())
        for value in strings:
            if not isinstance(value, str) or not value:
                raise ParameterError(f"a stop string must be a non-empty str, got {value!r}")
            check_text(value, f"stop string {value!r}")
        if strings and tokenizer is None:
            raise ParameterError("stop strings need a tokenizer to decode text; pass "
                                 "stop_tokens or build the Generator with a tokenizer")
        self.strings = strings
        self.tokens = set(check_stop_tokens(stop_tokens, vocab_size))
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
            while end and text[end - 1] == INCOMPLETE:
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
