"""SamplingParams: every setting of the keyed draw (SAMPLER.md), checked where it is made.

Invariant: a SamplingParams that exists holds only values the draw is defined for (a bad one
raises ParameterError naming the field, with what would be valid), and its request fields (the
names other libraries put there: max_tokens, stop, n) never reach the draw.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from exactdraft.arguments import checked_sample_count
from exactdraft.errors import ParameterError

_MASK = (1 << 64) - 1  # seeds are unsigned 64-bit integers


def fresh_seed() -> int:
    """63 random bits from the operating system."""
    return int.from_bytes(os.urandom(8), "little") >> 1


# Bias and additive penalties are bounded so that no processed logit can overflow float64 on
# its way to the draw: -1e9 bans a token as surely as -inf would (exp(-1e9) is 0).
BIAS_LIMIT = 1e9
# repetition_penalty multiplies or divides a logit: bounded for the same reason.
REPETITION_PENALTY_RANGE = (1e-9, 1e9)
# The logit that bans a token from a row (a drafter's tokens outside its vocabulary, say).
BANNED = -1e9


@dataclass(frozen=True)
class SamplingParams:
    """How a token is drawn from a logits row. Checked on construction; see SAMPLER.md.

    The defaults are the model's own distribution: temperature 1.0 and no filter, bias or
    penalty (temperature 0 is greedy). `seed=None` draws a fresh seed per generation, reported
    in the result so the run can be replayed. Values are bounded so that no processed logit
    can overflow: logit_bias values and presence/frequency penalties lie in [-1e9, 1e9],
    repetition_penalty in [1e-9, 1e9]. Errors are ParameterErrors naming the field.

    `max_tokens`, `stop` and `n` are request settings, as vLLM's SamplingParams carries them:
    generate and stream use them when the call does not name them (None: 256 tokens; `n`
    samples per prompt), and they never reach the draw (see REQUEST_FIELDS)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    seed: int | None = None
    max_tokens: int | None = field(default=None, metadata={"request": True})
    stop: str | Sequence[str] = field(default=(), metadata={"request": True})
    n: int = field(default=1, metadata={"request": True})

    def __post_init__(self) -> None:
        def number(name: str, value: Any = None, what: str | None = None) -> float:
            value = getattr(self, name) if what is None else value
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating,
                                                                 np.integer)) \
                    or not math.isfinite(value):
                raise ParameterError(f"{what or name} must be a finite number, got {value!r}")
            return float(value)

        def bounded(name: str, value: Any = None, what: str | None = None) -> float:
            checked = number(name, value, what)
            if abs(checked) > BIAS_LIMIT:
                raise ParameterError(f"{what or name} must lie in [-{BIAS_LIMIT:g}, "
                                     f"{BIAS_LIMIT:g}], got {checked!r}")
            return checked

        if number("temperature") < 0:
            raise ParameterError(f"temperature must be >= 0 (0 = greedy), got "
                                 f"{self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) \
                or self.top_k < 0:
            raise ParameterError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not 0 < number("top_p") <= 1:
            raise ParameterError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not 0 <= number("min_p") <= 1:
            raise ParameterError(f"min_p must be in [0, 1], got {self.min_p!r}")
        low, high = REPETITION_PENALTY_RANGE
        if not low <= number("repetition_penalty") <= high:
            raise ParameterError(f"repetition_penalty must be in [{low:g}, {high:g}] (1 = off), "
                                 f"got {self.repetition_penalty!r}")
        bounded("presence_penalty")
        bounded("frequency_penalty")
        if self.logit_bias is not None and not isinstance(self.logit_bias, Mapping):
            raise ParameterError(f"logit_bias must be a dict of token id -> bias, got "
                                 f"{type(self.logit_bias).__name__} {self.logit_bias!r}")
        bias = dict(self.logit_bias or {})
        for token, value in bias.items():
            if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or token < 0:
                raise ParameterError(f"logit_bias key must be a token id >= 0, got {token!r}")
            bounded("logit_bias", value, f"logit_bias[{token}]")
        object.__setattr__(self, "logit_bias", {int(t): float(v) for t, v in bias.items()})
        object.__setattr__(self, "top_k", int(self.top_k))
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                     "frequency_penalty"):  # numpy scalars become Python floats (JSON-safe)
            object.__setattr__(self, name, float(getattr(self, name)))
        if self.seed is not None and (isinstance(self.seed, bool) or
                                      not isinstance(self.seed, (int, np.integer)) or
                                      not 0 <= self.seed <= _MASK):
            raise ParameterError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))
        self._check_request_fields()

    def _check_request_fields(self) -> None:
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or
                                            not isinstance(self.max_tokens, (int, np.integer))
                                            or self.max_tokens < 0):
            raise ParameterError(f"max_tokens must be an integer >= 0 or None, got "
                                 f"{self.max_tokens!r}")
        object.__setattr__(self, "n", checked_sample_count(self.n))
        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, Sequence) or \
                not all(isinstance(text, str) and text for text in stop):
            raise ParameterError(f"stop must be a non-empty string or a list of them, got "
                                 f"{self.stop!r}")
        object.__setattr__(self, "stop", tuple(stop))
        if self.max_tokens is not None:
            object.__setattr__(self, "max_tokens", int(self.max_tokens))
        object.__setattr__(self, "n", int(self.n))

    def without_request(self) -> SamplingParams:
        """The same draw with the request settings (max_tokens, stop, n) at their defaults."""
        return replace(self, max_tokens=None, stop=(), n=1)

    @classmethod
    def greedy(cls) -> SamplingParams:
        return cls(temperature=0.0)

    @classmethod
    def from_generation_config(cls, config: Mapping[str, Any] | None,
                               source: str = "generation_config.json") -> SamplingParams:
        """The defaults a checkpoint's generation_config.json asks for: its temperature,
        top_k, top_p, min_p and repetition_penalty over SamplingParams(), and greedy when it
        says do_sample: false. A value exactdraft cannot use is warned about and skipped."""
        params = cls()
        if not isinstance(config, Mapping):
            return params
        for name in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty"):
            value = config.get(name)
            if value is None:
                continue
            try:
                params = replace(params, **{name: value})
            except ParameterError as error:
                warnings.warn(f"{source}: ignoring {name}: {error}", RuntimeWarning,
                              stacklevel=2)
        if config.get("do_sample") is False:
            params = replace(params, temperature=0.0)
        return params

    def check_drawable(self) -> None:
        """A ParameterError unless a draw can be made with these settings: a sampled draw
        (temperature > 0) needs its seed resolved (with_seed) first."""
        if self.temperature > 0 and self.seed is None:
            raise ParameterError("params.seed is None: resolve one first with params.with_seed()")

    def with_seed(self, seed: int | None = None) -> SamplingParams:
        """A copy with this seed, or with a fresh OS seed when none is given or set."""
        if seed is None:
            seed = self.seed if self.seed is not None else fresh_seed()
        return replace(self, seed=seed)

    @property
    def uses_history(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)


# The fields that decide the draw, and those that only shape the request.
SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams) if not f.metadata.get("request"))
REQUEST_FIELDS = tuple(f.name for f in fields(SamplingParams) if f.metadata.get("request"))


def sampling_from(sampling: SamplingParams | Mapping[str, Any] | None, default: SamplingParams,
                  shorthand: Mapping[str, Any] | None = None,
                  where: str = "generate") -> SamplingParams:
    """The parameters of one call. `sampling` is a SamplingParams (used as it is) or a dict of
    its fields (applied over `default`); `shorthand` holds fields passed one by one as keyword
    arguments (None = not given), also applied over `default`. Passing both is refused."""
    given = {name: value for name, value in (shorthand or {}).items() if value is not None}
    if sampling is not None and given:
        named = ", ".join(f"{name}=" for name in given)
        raise ParameterError(f"{where}() got both sampling= and {named}; pass the settings "
                             "one way: sampling=SamplingParams(...) or the keywords alone")
    if isinstance(sampling, SamplingParams):
        return sampling
    if sampling is not None:
        if not isinstance(sampling, Mapping):
            raise ParameterError(f"{where}(): sampling must be a SamplingParams or a dict of "
                                 f"its fields, got {type(sampling).__name__} {sampling!r}")
        given = dict(sampling)
    for name in given:
        if name not in SAMPLING_FIELDS + REQUEST_FIELDS:
            raise ParameterError(f"{where}(): unknown sampling setting {name!r}; valid "
                                 f"settings: {', '.join(SAMPLING_FIELDS + REQUEST_FIELDS)}")
    return replace(default, **given) if given else default


def positional_sampling(max_new_tokens: Any, sampling: Any) -> tuple[Any, Any]:
    """(max_new_tokens, sampling) of a call that may give the sampling settings second, as
    vLLM's `llm.generate(prompts, sampling_params)` does: a SamplingParams or a dict in the
    max_new_tokens place is the sampling (its max_tokens then applies, or max_tokens=)."""
    if sampling is None and isinstance(max_new_tokens, (SamplingParams, Mapping)):
        return None, max_new_tokens
    return max_new_tokens, sampling
