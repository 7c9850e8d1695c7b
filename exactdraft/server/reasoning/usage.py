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
has no reasoning or the model wrote none. The offsets are found in one pass over the tokens
(each decoded in a short window), and only for a reply whose usage is sent.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

from exactdraft.server.reasoning.formats import reasoning_splitters
from exactdraft.stops import INCOMPLETE

# Tokens decoded before a window's first token, for the decoders whose text of a token depends
# on the token before it (a leading space dropped at the start, bytes merged into characters).
CONTEXT_TOKENS = 4


def text_offsets(tokens: Sequence[int], decode: Callable[[list[int]], str]) -> list[int]:
    """`offsets[k]`: the length of the text the first k tokens settle (their decoded text, an
    incomplete character at its end held back), for k in [0, len(tokens)], in one pass.

    Each token's text is read from a short window: the tokens since the last settled point
    (an anchor) and CONTEXT_TOKENS before it, decoded, less the window's text up to the anchor.
    Where the whole text's length disagrees with the last offset (a decoder whose text is not
    local), every prefix is decoded instead (`prefix_offsets`)."""
    tokens = list(tokens)
    offsets = [0]
    anchor, at_anchor = 0, 0  # a settled point: its token index and its offset
    context_start, context_length = 0, 0  # the window's first token; its text up to the anchor
    for k in range(1, len(tokens) + 1):
        tail = decode(tokens[context_start:k])[context_length:]
        settled = tail.rstrip(INCOMPLETE)
        offsets.append(at_anchor + len(settled))
        if len(settled) == len(tail):  # nothing held back: the next anchor
            anchor, at_anchor = k, at_anchor + len(tail)
            context_start = max(0, anchor - CONTEXT_TOKENS)
            context_length = len(decode(tokens[context_start:anchor]))
    if offsets[-1] != len(decode(tokens).rstrip(INCOMPLETE)):
        return prefix_offsets(tokens, decode)
    return offsets


def prefix_offsets(tokens: Sequence[int], decode: Callable[[list[int]], str]) -> list[int]:
    """The offsets of `text_offsets` by their definition: every prefix decoded whole."""
    tokens = list(tokens)
    return [len(decode(tokens[:k]).rstrip(INCOMPLETE)) for k in range(len(tokens) + 1)]


def reasoning_token_count(spans: Sequence[Sequence[int]], tokens: Sequence[int],
                          decode: Callable[[list[int]], str]) -> int:
    """The tokens whose text overlaps one of `spans` ([start, end) character offsets in the
    text the tokens decode to, in order), each token counted once."""
    spans = [(start, end) for start, end in spans if end > start]
    if not spans:
        return 0
    offsets = text_offsets(tokens, decode)
    count = len(offsets) - 1

    def reaching(low: int, offset: int) -> int:
        """The first k >= low with offsets[k] >= offset (count + 1 if none): the offsets
        only grow with k."""
        return bisect.bisect_left(offsets, offset, low)

    total, counted_to = 0, 0
    for start, end in spans:
        # Token i counts when it starts before `end` and does not end at or before `start`
        # while also starting before it (a token without text at `start` is inside).
        before_end = min(reaching(0, end), count)
        ended_by_start = reaching(1, start + 1) - 1
        started_before = min(reaching(0, start), count)
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
