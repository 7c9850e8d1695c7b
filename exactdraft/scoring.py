"""Scoring: the logprob of each given token after the tokens before it, from the target's rows.

Invariant: the logprob of tokens[i] is KeyedSampler.logprobs of the target's row at position
i - 1 after tokens[:i], with history tokens[:i] and the same n_prompt, sampling parameters and
top count: the very call decoding makes for a token it commits. The rows come from prefill
passes (up to the Generator's prefill_chunk tokens each) which, by the Target protocol's row
invariance, hold the bits single steps give; so scoring a prompt and its output gives, bit for
bit, the logprobs the output got when it was decoded one token at a time (tests/
test_scoring.py). That holds where row invariance does, which the load-time guard measures
when a drafter is set; on a target where it found otherwise (Generator.drafting_note, already
warned about at load) scores are computed the same way and may differ from decoding's.
A token the sampling filters (top-k, top-p, min-p) drop gets logprob -inf, with the top
alternatives of the row still reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from exactdraft.errors import ParameterError
from exactdraft.generator import Generator
from exactdraft.prompts import PromptInput, encode_prompt
from exactdraft.sampling.keyed import MAX_TOP_LOGPROBS, TokenLogprob
from exactdraft.sampling.params import SAMPLING_FIELDS, SamplingParams, sampling_from


def token_logprobs(generator: Generator, tokens: Sequence[int], *, start: int = 1,
                   n_prompt: int | None = None, top: int = 0,
                   sampling: SamplingParams | Mapping[str, Any] | None = None,
                   **fields: Any) -> list[TokenLogprob]:
    """The logprobs of tokens[start:], each after the tokens before it (token 0 has none:
    nothing comes before it). `n_prompt` (default `start`): how many leading tokens are the
    prompt, for the penalties that count only generated tokens; `top`: how many most probable
    alternatives to report (0..20); sampling as for Generator.generate (its default when
    none is given; the seed plays no part)."""
    ids = _checked_tokens(generator, tokens)
    if isinstance(start, bool) or not isinstance(start, int) or not 1 <= start <= len(ids):
        raise ParameterError(f"start must be an integer in [1, {len(ids)}], got {start!r}")
    n_prompt = start if n_prompt is None else n_prompt
    if isinstance(n_prompt, bool) or not isinstance(n_prompt, int) or \
            not 0 <= n_prompt <= len(ids):
        raise ParameterError(f"n_prompt must be an integer in [0, {len(ids)}], got "
                             f"{n_prompt!r}")
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ParameterError(f"top must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top!r}")
    unknown = sorted(set(fields) - set(SAMPLING_FIELDS))
    if unknown:
        raise ParameterError(f"token_logprobs() got unknown settings {', '.join(unknown)}; "
                             f"valid sampling settings: {', '.join(SAMPLING_FIELDS)}")
    params = sampling_from(sampling, generator.sampling, fields, "token_logprobs")
    if start == len(ids):
        return []
    rows = _rows(generator, ids[:-1], first=start - 1)
    return [_logprob(generator, row, params, ids, i, n_prompt, top)
            for row, i in zip(rows, range(start, len(ids)))]


def score(generator: Generator, prompt: PromptInput,
          continuation: str | Sequence[int] | None = None, *, top: int = 0,
          sampling: SamplingParams | Mapping[str, Any] | None = None,
          **fields: Any) -> list[TokenLogprob]:
    """The logprobs of `continuation` (token ids, or text encoded without special tokens)
    after `prompt` (text, token ids or chat messages, as for generate); without a
    continuation, those of the prompt's tokens after its first."""
    target = generator.target
    prompt_ids = encode_prompt(prompt, generator.tokenizer, target.vocab_size)
    if continuation is None:
        return token_logprobs(generator, prompt_ids, start=1, n_prompt=len(prompt_ids),
                              top=top, sampling=sampling, **fields)
    if isinstance(continuation, str):
        if generator.tokenizer is None:
            raise ParameterError("a text continuation needs a tokenizer; pass token ids")
        more = generator.tokenizer.encode(continuation, add_special_tokens=False)
    else:
        more = encode_prompt(continuation, None, target.vocab_size) if continuation else []
    return token_logprobs(generator, prompt_ids + list(more), start=len(prompt_ids), top=top,
                          sampling=sampling, **fields)


def _checked_tokens(generator: Generator, tokens: Sequence[int]) -> list[int]:
    target = generator.target
    if isinstance(tokens, (str, bytes)) or not isinstance(tokens, (Sequence, np.ndarray)):
        raise ParameterError(f"tokens must be a list of token ids, got "
                             f"{type(tokens).__name__}")
    ids = encode_prompt(list(tokens) if isinstance(tokens, np.ndarray) else tokens, None,
                        target.vocab_size)
    if len(ids) > target.max_context:
        raise ParameterError(f"{len(ids)} tokens do not fit the model's context of "
                             f"{target.max_context}")
    return ids


def _rows(generator: Generator, ids: list[int], first: int) -> list[np.ndarray]:
    """The target's rows at positions first..len(ids)-1 after appending `ids` to an empty
    state, in passes of prefill_chunk tokens."""
    target = generator.target
    width = generator.prefill_chunk
    state = target.new_state()
    rows: list[np.ndarray] = []
    for begin in range(0, len(ids), width):
        chunk = ids[begin:begin + width]
        wanted = begin + len(chunk) > first
        with generator.lock:  # one pass at a time, between the passes of other users
            logits = target.forward(state, chunk, rows="all" if wanted else "last")
        if wanted:
            rows.extend(logits[max(first - begin, 0):])
    return rows


def _logprob(generator: Generator, row: np.ndarray, params: SamplingParams, ids: list[int],
             i: int, n_prompt: int, top: int) -> TokenLogprob:
    sampler, history = generator.sampler, ids[:i]
    try:
        return sampler.logprobs(row, params, token=ids[i], history=history, n_prompt=n_prompt,
                                top=top)
    except ValueError:  # the filters dropped ids[i] (a NaN row raises again just below)
        x = sampler.processed(row, params, np.asarray(history, dtype=np.int64), n_prompt)
        best = sampler.logprobs(row, params, token=int(np.argmax(x)), history=history,
                                n_prompt=n_prompt, top=top)
        return TokenLogprob(ids[i], -math.inf, best.top)
