"""Turning what a caller passes as a prompt into checked token ids.

Invariant: a prompt reaches the model only as a non-empty list of ids inside the vocabulary;
anything else is refused here with the offending value named, before any state is touched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

PromptInput = str | Sequence[int] | Sequence[Mapping[str, Any]] | np.ndarray


def encode_prompt(prompt: PromptInput, tokenizer: Any | None, vocab_size: int) -> list[int]:
    """Text, token ids or chat messages ([{"role": ..., "content": ...}]) -> token ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer; pass token ids instead")
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, np.ndarray):
        if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
            raise ValueError(f"a token id array must be 1-D integers, got {prompt.dtype} "
                             f"{prompt.shape}")
        ids = prompt.tolist()
    elif isinstance(prompt, Sequence) and prompt and isinstance(prompt[0], Mapping):
        if tokenizer is None:
            raise ValueError("chat messages need a tokenizer with a chat template")
        ids = tokenizer.encode(tokenizer.render_chat(list(prompt)), add_special_tokens=False)
    elif isinstance(prompt, Sequence):
        ids = list(prompt)
        for index, value in enumerate(ids):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"prompt item {index} is {value!r}, not a token id")
    else:
        raise ValueError(f"unsupported prompt type {type(prompt).__name__}: pass text, token "
                         "ids or chat messages")
    ids = [int(t) for t in ids]
    if not ids:
        raise ValueError("the prompt is empty")
    for index, value in enumerate(ids):
        if not 0 <= value < vocab_size:
            raise ValueError(f"prompt token id {value} at index {index} is outside the "
                             f"vocabulary [0, {vocab_size})")
    return ids
