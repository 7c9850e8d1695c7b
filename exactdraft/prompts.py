"""Turning what a caller passes as a prompt into checked token ids.

Invariant: a prompt reaches the model only as a non-empty list of ids inside the vocabulary;
anything else is refused here with the offending value named, before any state is touched.
Text reaches a tokenizer only when it is valid Unicode (no lone surrogates).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from exactdraft.errors import ParameterError, TokenizerError

PromptInput = str | Sequence[int] | Sequence[Mapping[str, Any]] | np.ndarray


def check_text(text: str, what: str) -> str:
    """`text` if it can be encoded as UTF-8, else a TokenizerError naming the first lone
    surrogate (text decoded with errors="surrogateescape" or cut inside a surrogate pair)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise TokenizerError(
            f"{what} holds a lone surrogate {text[error.start]!r} at character {error.start}, "
            "which is not text; decode the bytes with errors='replace' or drop it") from None
    return text


def encode_prompt(prompt: PromptInput, tokenizer: Any | None, vocab_size: int) -> list[int]:
    """Text, token ids or chat messages ([{"role": ..., "content": ...}]) -> token ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ParameterError("a text prompt needs a tokenizer; pass token ids instead")
        ids = tokenizer.encode(check_text(prompt, "the prompt"))
    elif isinstance(prompt, np.ndarray):
        if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
            raise ParameterError(f"a token id array must be 1-D integers, got {prompt.dtype} "
                                 f"{prompt.shape}")
        ids = prompt.tolist()
    elif isinstance(prompt, Sequence) and prompt and isinstance(prompt[0], Mapping):
        if tokenizer is None:
            raise ParameterError("chat messages need a tokenizer with a chat template")
        for index, message in enumerate(prompt):
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, str):
                check_text(content, f"message {index}'s content")
        text = check_text(tokenizer.render_chat(list(prompt)), "the rendered chat")
        ids = tokenizer.encode(text, add_special_tokens=False)
    elif isinstance(prompt, Sequence):
        ids = list(prompt)
        for index, value in enumerate(ids):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ParameterError(f"prompt item {index} is {value!r}, not a token id")
    else:
        raise ParameterError(f"unsupported prompt type {type(prompt).__name__}: pass text, "
                             "token ids or chat messages")
    ids = [int(t) for t in ids]
    if not ids:
        raise ParameterError("the prompt is empty")
    for index, value in enumerate(ids):
        if not 0 <= value < vocab_size:
            raise ParameterError(f"prompt token id {value} at index {index} is outside the "
                                 f"vocabulary [0, {vocab_size})")
    return ids
