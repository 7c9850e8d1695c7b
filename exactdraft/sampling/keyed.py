"""KeyedSampler: the target's own sample, as SAMPLER.md defines it (its settings are
exactdraft.sampling.params.SamplingParams, importable from here too).

Invariant: the token returned for a row is a pure function of (the row's float32 logits, the
sampling parameters, the token history, the seed, the absolute position), equal to the token
SAMPLER.md's definition returns. Nothing else reaches the draw: no global random state, no
batch size, no draft depth. The vectorised paths below only skip work that provably cannot
change the answer (see the bounds in `_candidates`), and every decision that floating-point
transcendental functions could tip (a near-tie between two noisy scores, a top-p cut that
lands within rounding of its threshold) is re-decided with Python's own `math` functions, the
reference the definition is written against. When the C extension exactdraft._sampler is
built, KeyedSampler runs steps 3-9 there instead (exactdraft.sampling.native): it calls the same
C library exp and log as the math module, so it decides those cases exactly with no fallback,
and it returns the same tokens.

Logprobs (`KeyedSampler.logprobs`) describe the distribution the draw is made from: after bias
and penalties (step 2), temperature (step 6) and the top-k, top-p and min-p filters (steps 5,
7, 8); a token the filters drop has logprob -inf. Greedy draws (temperature 0) take the argmax
of that processed row, and their logprobs are of softmax(processed row), temperature 1, no
filter. They are a pure function of the same inputs as the token, so equal rows give equal
logprobs, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import exactdraft.sampling.native as sampling_native
from exactdraft import float64_math
from exactdraft.errors import ParameterError
from exactdraft.sampling.params import (
    BANNED,
    SamplingParams,
)

_GOLDEN = 0x9E3779B97F4A7C15
_POSITION_MULTIPLIER = 0xD1B54A32D192ED03
_MASK = (1 << 64) - 1
# g = -log(-log(u)) with u in [2**-54, 1 - 2**-54], so the noise lies in [-3.62, 37.43]: a
# candidate more than this far below the best score cannot win, and its weight exp(-45) is
# below half an ulp of the top-p running sum (which starts at 1), so it cannot move that sum.
_IRRELEVANT_BELOW = 45.0


def mix64(z: int) -> int:
    """splitmix64's finalizer on a Python int, wrapping modulo 2**64."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _mix_array(z: np.ndarray) -> np.ndarray:
    """The same finalizer on a uint64 array (numpy wraps uint64 arithmetic modulo 2**64)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _position_key(seed: int, pos: int) -> int:
    return mix64(mix64((seed + _GOLDEN) & _MASK) ^ ((pos * _POSITION_MULTIPLIER) & _MASK))


def noise_key(seed: int, pos: int, token: int) -> int:
    """key(seed, pos, tok) of SAMPLER.md."""
    return mix64(_position_key(seed, pos) ^ token)


def keyed_uniform(seed: int, pos: int, tokens: Any) -> np.ndarray:
    """u(seed, pos, tok) for an array of token ids: float64 strictly inside (0, 1)."""
    ids = np.asarray(tokens, dtype=np.uint64)
    keys = _mix_array(ids ^ np.uint64(_position_key(seed, pos)))
    return ((keys >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def gumbel_noise(seed: int, pos: int, token: int) -> float:
    """g(seed, pos, tok) of SAMPLER.md, for one token."""
    u = ((noise_key(seed, pos, token) >> 11) + 0.5) * 2.0**-53
    return float(-float64_math.log(-float64_math.log(u)))


@dataclass(frozen=True)
class TokenLogprob:
    """A committed token's log-probability and the most probable tokens with theirs (most
    probable first, ties to the lower id), in the distribution its draw was made from."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


MAX_TOP_LOGPROBS = 20


class KeyedSampler:
    """Gumbel-max sampling keyed by (seed, position, token id): SAMPLER.md's rule.

    `native` picks how steps 3-9 run: True uses the C extension exactdraft._sampler (and
    raises if it is not built), False the numpy path below, None (the default) the extension
    when it is built. Both return the same tokens."""

    def __init__(self, native: bool | None = None) -> None:
        if native and not sampling_native.available():
            raise sampling_native.NativeSamplerUnavailable(sampling_native.unavailable_reason())
        self.native = sampling_native.available() if native is None else bool(native)

    def sample(self, logits_row: np.ndarray, params: SamplingParams, *, pos: int,
               history: Sequence[int] = (), n_prompt: int | None = None) -> int:
        """The token at absolute position `pos`. `history` holds every token before `pos`,
        the first `n_prompt` of them the prompt (None: all of it)."""
        return self.sample_window(np.asarray(logits_row)[None], params, pos=pos,
                                  history=history, n_prompt=n_prompt, drafts=())[0]

    def sample_among(self, values: np.ndarray, ids: np.ndarray, vocab_size: int,
                     params: SamplingParams, *, pos: int, history: Sequence[int] = (),
                     n_prompt: int | None = None) -> int:
        """`sample` of the `vocab_size` row in which tokens `ids` (ascending, distinct) have
        logits `values` and every other token is banned (logit BANNED), in work that scales
        with len(ids) where that provably gives the same token: without bias and penalties,
        and with the best value further above the ban than the noise can reach (every banned
        token then falls out of the candidates, and the candidates keep their order, so steps
        4-9 see what they would see in the full row). Otherwise it builds that row."""
        values = np.asarray(values, dtype=np.float32)
        ids = np.asarray(ids, dtype=np.int64)
        if values.shape != ids.shape or ids.ndim != 1 or ids.size == 0:
            raise ParameterError(f"values {values.shape} and ids {ids.shape} must be equal "
                                 "1-D shapes, not empty")
        if ids[0] < 0 or ids[-1] >= vocab_size or (ids.size > 1 and np.diff(ids).min() <= 0):
            raise ParameterError(f"ids must ascend strictly inside [0, {vocab_size}), not "
                                 f"{ids[0]}..{ids[-1]} (or not ascending)")
        params.check_drawable()
        best = float(values.max())  # NaN fails the comparison below: the full row raises
        # Twice the reach and one more: no rounding of the full row's bound can bring a
        # banned token back among the candidates.
        reach = 2 * _IRRELEVANT_BELOW * params.temperature + 1.0
        if params.logit_bias or params.uses_history or not best - reach > BANNED:
            row = np.full(vocab_size, BANNED, dtype=np.float32)
            row[ids] = values
            return self.sample(row, params, pos=pos, history=history, n_prompt=n_prompt)
        if params.temperature == 0:  # the first maximum: the lowest id among ties
            return int(ids[int(np.argmax(values))])
        if self.native:
            return int(ids[sampling_native.draw_among(np.ascontiguousarray(values),
                                                      np.ascontiguousarray(ids), params, pos)])
        order, s = _candidates(values.astype(np.float64), params)
        return _gumbel_winner(ids[order], s, params.seed, pos)

    def sample_window(self, rows: np.ndarray, params: SamplingParams, *, pos: int,
                      history: Sequence[int], n_prompt: int | None = None,
                      drafts: Sequence[int] = ()) -> list[int]:
        """Samples for the rows of a verify window: row j is at position pos + j and its
        history is `history` followed by drafts[:j]. Sampling stops at the first row whose
        sample differs from its draft (later rows assume a draft that was rejected), so the
        result is drafts[:n] followed by the target's own token at row n. Each token equals
        what `sample` returns for that row alone."""
        rows = np.asarray(rows)
        if rows.ndim != 2:
            raise ValueError(f"expected logits rows [rows, vocab], got shape {rows.shape}")
        if len(drafts) < rows.shape[0] - 1:
            raise ValueError(f"{rows.shape[0]} rows need {rows.shape[0] - 1} drafts, "
                             f"got {len(drafts)}")
        params.check_drawable()
        n_prompt = len(history) if n_prompt is None else n_prompt
        if not 0 <= n_prompt <= len(history):
            raise ValueError(f"n_prompt {n_prompt} is outside [0, {len(history)}] (history "
                             "length)")
        if params.temperature == 0 and not params.logit_bias and not params.uses_history:
            # Widening float32 to float64 keeps the order and ties, so one argmax serves all rows.
            if np.isnan(rows).any():
                raise ValueError("logits rows contain NaN")
            return _accept_while_equal(np.argmax(rows, axis=1).tolist(), drafts)
        # Without bias and penalties step 2 only widens the row to float64, exactly, which the
        # extension does itself (float32 rows), with the same NaN error.
        plain = self.native and params.temperature > 0 and not params.logit_bias and \
            not params.uses_history and rows.dtype == np.float32
        past = None if plain else np.asarray(history, dtype=np.int64)
        tokens: list[int] = []
        for j, row in enumerate(rows):
            if plain:
                token = sampling_native.draw(np.ascontiguousarray(row), params, pos + j)
            else:
                row_history = np.concatenate([past, np.asarray(drafts[:j], dtype=np.int64)])
                x = self.processed(row, params, row_history, n_prompt)
                if params.temperature == 0:
                    token = int(np.argmax(x))
                elif self.native:
                    token = sampling_native.draw(x, params, pos + j)
                else:
                    token = _gumbel_winner(*_candidates(x, params), params.seed, pos + j)
            tokens.append(token)
            if j >= len(drafts) or token != drafts[j]:
                break
        return tokens

    def logprobs(self, logits_row: np.ndarray, params: SamplingParams, *, token: int,
                 history: Sequence[int], n_prompt: int, top: int = 0) -> TokenLogprob:
        """`token`'s logprob and the `top` most probable tokens (0..MAX_TOP_LOGPROBS) in the
        distribution `sample` draws from for this row (the module docstring says which)."""
        if isinstance(top, bool) or not isinstance(top, int) or \
                not 0 <= top <= MAX_TOP_LOGPROBS:
            raise ParameterError(f"top logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], "
                                 f"got {top!r}")
        x = self.processed(logits_row, params, np.asarray(history, dtype=np.int64), n_prompt)
        filtered = params.temperature > 0 and (0 < params.top_k < x.size or
                                               params.top_p < 1.0 or params.min_p > 0)
        if filtered:
            ids, s = _candidates(x, params, below=math.inf)
        else:
            ids = np.arange(x.size)
            s = x / params.temperature if params.temperature > 0 else x
        best = s.max()
        logp = s - (best + float(float64_math.log(np.sum(float64_math.exp(s - best)))))
        where = np.flatnonzero(ids == token)
        if where.size == 0:
            raise ValueError(f"token {token} is not in the distribution its draw was made from")
        chosen = float(logp[where[0]])
        if top == 0:
            return TokenLogprob(int(token), chosen)
        if not filtered:  # ids ascending: the `top` best by (logp descending, id ascending)
            count = min(top, logp.size)
            cut = np.partition(logp, logp.size - count)[logp.size - count]
            near = np.flatnonzero(logp >= cut)
            best_ids = near[np.lexsort((near, -logp[near]))][:top]
        else:  # already in (x descending, id ascending) order, which is logp's order
            best_ids = np.arange(min(top, ids.size))
        pairs = tuple((int(ids[i]), float(logp[i])) for i in best_ids if np.isfinite(logp[i]))
        return TokenLogprob(int(token), chosen, pairs)

    def processed(self, row: np.ndarray, params: SamplingParams, history: np.ndarray,
                  n_prompt: int) -> np.ndarray:
        """Step 2 of the draw: the float64 logits after bias and penalties."""
        x = np.array(row, dtype=np.float32).astype(np.float64)
        if x.ndim != 1:
            raise ValueError(f"a logits row must be 1-D, got shape {x.shape}")
        if np.isnan(x).any():
            raise ValueError(f"logits row has NaN at token {int(np.flatnonzero(np.isnan(x))[0])}")
        vocab = x.shape[0]
        if params.logit_bias:
            ids = np.fromiter(params.logit_bias, dtype=np.int64)
            if ids.max() >= vocab:
                raise ParameterError(f"logit_bias token id {int(ids.max())} is outside the "
                                 f"vocabulary [0, {vocab})")
            x[ids] += np.fromiter(params.logit_bias.values(), dtype=np.float64)
        if params.repetition_penalty != 1.0 and history.size:
            seen = np.unique(history)
            values = x[seen]
            x[seen] = np.where(values > 0, values / params.repetition_penalty,
                               values * params.repetition_penalty)
        if (params.presence_penalty or params.frequency_penalty) and history.size > n_prompt:
            ids, counts = np.unique(history[n_prompt:], return_counts=True)
            x[ids] -= params.presence_penalty + params.frequency_penalty * counts
        return x


def _accept_while_equal(samples: list[int], drafts: Sequence[int]) -> list[int]:
    for j, token in enumerate(samples):
        if j >= len(drafts) or token != drafts[j]:
            return samples[: j + 1]
    return samples


def _candidates(x: np.ndarray, params: SamplingParams,
                below: float = _IRRELEVANT_BELOW) -> tuple[np.ndarray, np.ndarray]:
    """Steps 4-8: the kept candidates in (x descending, id ascending) order and their scaled
    scores s, leaving out only candidates that provably neither win nor move a top-p sum (more
    than `below` under the best score; math.inf keeps every candidate the filters keep)."""
    scaled = x / params.temperature
    best = scaled.max()
    if not math.isfinite(best):
        raise ValueError(f"logits row has no finite maximum after processing (max {best})")
    ids = np.flatnonzero(scaled >= best - below)
    # Stable sort on descending x keeps ascending ids among equal values.
    order = ids[np.argsort(-x[ids], kind="stable")]
    if 0 < params.top_k < order.size:
        order = order[: params.top_k]
    s = scaled[order]
    if params.top_p < 1.0:
        keep = _top_p_count(s, params.top_p)
        order, s = order[:keep], s[:keep]
    if params.min_p > 0:
        keep = int(np.count_nonzero(s >= s[0] + float(float64_math.log(params.min_p))))
        order, s = order[:keep], s[:keep]
    return order, s


def _top_p_count(s: np.ndarray, top_p: float) -> int:
    """n + 1 where n is the first index with cumsum(exp(s - s[0]))[n] >= top_p * total; the
    sums are sequential float64 additions (np.cumsum), as the definition adds them."""
    cumulative = np.cumsum(float64_math.exp(s - s[0]))
    return int(np.argmax(cumulative >= top_p * cumulative[-1])) + 1


def _gumbel_winner(order: np.ndarray, s: np.ndarray, seed: int, pos: int) -> int:
    """Step 9: the kept candidate with the largest s + g; exact ties go to the earlier one."""
    u = keyed_uniform(seed, pos, order)
    if u.max() >= 1.0:  # (2**53 - 1) + 0.5 rounds up: a 2**-53 chance per candidate
        token = int(order[int(np.argmax(u))])
        raise ValueError(f"the keyed uniform of token {token} rounds to 1.0, where "
                         "-log(-log(u)) is undefined")
    scores = s + -float64_math.log(-float64_math.log(u))
    return int(order[int(np.argmax(scores))])
