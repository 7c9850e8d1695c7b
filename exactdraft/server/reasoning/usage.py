"""Reasoning tokens: how many of a reply's generated tokens belong to its reasoning, the figure
the usage reports (OpenAI's `reasoning_tokens`, counted within the output tokens).

Invariant: the count reads the committed tokens and their text only, so a whole reply and its
stream report the same figure, and it never changes what is generated. The reasoning is where
the reply's splitter found it in the text, its markup included (`<think>` ... `</think>`, a
Harmony analysis message from its header to its `<|end|>`). Tokens are paired with the text
as the stream pairs them (exactdraft/stops.py): token i stands for the characters between the
text decoded from the first i tokens and from the first i + 1, an incomplete character at the
end held back. A token whose text overlaps the reasoning counts, once, so a token straddling
the reasoning's edge counts as reasoning; a token without text of its own (a byte a later
token completes, a stop token) counts where it stands inside the reasoning. 0 when the template
has no reasoning or the model wrote none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from exactdraft.server.reasoning.formats import reasoning_splitters

INCOMPLETE = "\ufffd"  # what a decoder writes for bytes a later token completes


class TextOffsets:
    """Where each token's text starts in the reply's text: `at(k)` is the length of the text
    the first k tokens settle, decoded once per k asked for."""

    def __init__(self, tokens: Sequence[int], decode: Callable[[list[int]], str]) -> None:
        self.tokens, self.decode = list(tokens), decode
        self.known: dict[int, int] = {0: 0}

    def at(self, k: int) -> int:
        if k not in self.known:
            self.known[k] = len(self.decode(self.tokens[:k]).rstrip(INCOMPLETE))
        return self.known[k]

    def reaching(self, low: int, offset: int) -> int:
        """The first k in [low, len(tokens)] with at(k) >= offset, len(tokens) + 1 if none; the
        offsets only grow with k, so a binary search finds it."""
        if self.at(low) >= offset:  # a span at the start of the text: no search
            return low
        high = len(self.tokens) + 1
        while low < high:
            middle = (low + high) // 2
            if self.at(middle) >= offset:
                high = middle
            else:
                low = middle + 1
        return low


def reasoning_token_count(spans: Sequence[Sequence[int]], tokens: Sequence[int],
                          decode: Callable[[list[int]], str]) -> int:
    """The tokens whose text overlaps one of `spans` ([start, end) character offsets in the
    text the tokens decode to, in order), each token counted once."""
    offsets = TextOffsets(tokens, decode)
    count = len(tokens)
    total, counted_to = 0, 0
    for start, end in spans:
        if end <= start:
            continue
        # Token i counts when it starts before `end` and does not end at or before `start`
        # while also starting before it (a token without text at `start` is inside).
        before_end = min(offsets.reaching(0, end), count)
        ended_by_start = offsets.reaching(1, start + 1) - 1
        started_before = min(offsets.reaching(0, start), count)
        first = max(min(ended_by_start, started_before), counted_to)
        total += max(before_end - first, 0)
        counted_to = max(counted_to, before_end)
    return total


def reasoning_counter(tokenizer: Any,
                      prompt_ids: Sequence[int]) -> Callable[[str | None, Sequence[int]], int]:
    """A counter of the reasoning tokens of the replies to one prompt: given a reply's text and
    its tokens. It counts where the template has reasoning whether or not the request keeps
    the reasoning apart (`separate_reasoning`): the tokens are the same."""
    make = reasoning_splitters(tokenizer, prompt_ids)

    def count(text: str | None, tokens: Sequence[int]) -> int:
        if make is None or not text:
            return 0
        splitter = make()
        splitter.feed(text)
        splitter.finish()
        return reasoning_token_count(splitter.spans, tokens, tokenizer.decode)

    return count
