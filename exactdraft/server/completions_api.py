"""The OpenAI completions wire format beyond one generation: /v1/completions with a list of
prompts, `echo` and `max_tokens: 0` (what evaluation harnesses send to score text).

Invariant: a list of prompts (strings, or token-id lists) gets one choice per prompt and
sample, `index` = prompt * n + sample, each exactly what that prompt alone gets. With `echo`,
a choice's text starts with its prompt (as sent, or decoded from its ids) and, with
`logprobs`, its logprobs start with the prompt's tokens: the first token's logprob and top
alternatives are null (nothing precedes it, as OpenAI writes it), every other one is
exactdraft.scoring's, bit for bit the logprob that token gets when decoded after the tokens
before it, under the request's sampling settings (a token the filters drop: -9999.0, as JSON
has no -inf). `max_tokens: 0` generates nothing, so an echoed choice is its prompt alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from exactdraft.sampling.keyed import TokenLogprob
from exactdraft.server.fields import (
    RequestError,
    Wanted,
    constraint_from,
    integer,
    refuse_unsupported,
    typed,
)
from exactdraft.server.openai_api import common
from exactdraft.server.service import Service

MAX_PROMPTS = 128
FILTERED_LOGPROB = -9999.0  # a prompt token the sampling filters drop (logprob -inf)


def completion_request(body: Mapping[str, Any],
                       service: Service) -> tuple[list[Any], Wanted, bool]:
    """(the prompts, what each asks for, echo); `wanted.prompt` is the first prompt."""
    refuse_unsupported(body, ("tools", "tool_choice"))  # a completion has no chat to call from
    prompts = prompt_list(body.get("prompt"))
    wanted = common(body, service, prompts[0])
    wanted.constraint = constraint_from(body)
    if wanted.max_tokens is None:
        wanted.max_tokens = min(16, service.target.max_context - 1)  # OpenAI's default
    wanted.logprobs = integer(body, "logprobs", 0, 20)
    echo = typed(body, "echo", (bool,), "true or false", False)
    return prompts, wanted, echo


def prompt_list(prompt: Any) -> list[Any]:
    """A string, a list of token ids, or a list of those (at most MAX_PROMPTS)."""
    def is_ids(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and \
            all(isinstance(t, int) and not isinstance(t, bool) for t in value)

    def is_text(value: Any) -> bool:
        return isinstance(value, str) and bool(value)

    if is_text(prompt) or is_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and len(prompt) <= MAX_PROMPTS:
        for index, item in enumerate(prompt):
            if not (is_text(item) or is_ids(item)):
                raise RequestError(f"prompt[{index}] must be a non-empty string or a list of "
                                   "token ids", f"prompt[{index}]")
        return list(prompt)
    raise RequestError(f"prompt must be a non-empty string, a list of token ids, or a list of "
                       f"at most {MAX_PROMPTS} of those", "prompt")


def echo_text(service: Service, prompt: Any, ids: Sequence[int]) -> str:
    """The prompt as echoed: as sent when it is text, else its ids decoded."""
    if isinstance(prompt, str):
        return prompt
    if service.tokenizer is None:
        return "".join(service.piece(t) for t in ids)
    return service.tokenizer.decode(list(ids))


def echo_logprobs(service: Service, ids: Sequence[int],
                  scored: list[TokenLogprob]) -> dict[str, list[Any]]:
    """The prompt part of a completions logprobs object: null for the first token."""
    piece = service.piece
    tokens = [piece(t) for t in ids]
    offsets, offset = [], 0
    for token in tokens:
        offsets.append(offset)
        offset += len(token)

    def finite(value: float) -> float:
        return value if math.isfinite(value) else FILTERED_LOGPROB

    return {"tokens": tokens,
            "token_logprobs": [None] + [finite(e.logprob) for e in scored],
            "top_logprobs": [None] + [{piece(t): lp for t, lp in e.top} for e in scored],
            "text_offset": offsets}


def with_echo(choice: dict[str, Any], text: str, prompt_logprobs: dict[str, list] | None,
              completion_logprobs: dict[str, list] | None) -> dict[str, Any]:
    """A choice (whole, or a stream's first chunk of it) with the prompt in front."""
    choice["text"] = text + choice["text"]
    if prompt_logprobs is not None:
        after = completion_logprobs or {"tokens": [], "token_logprobs": [],
                                        "top_logprobs": [], "text_offset": []}
        choice["logprobs"] = {name: prompt_logprobs[name] + after[name]
                              for name in ("tokens", "token_logprobs", "top_logprobs",
                                           "text_offset")}
    return choice
