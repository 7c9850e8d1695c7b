"""What a generation produces, and the request it runs: results, streamed chunks, statistics.

Invariant: a result holds exactly what its generation committed (tokens, their text, their
logprobs, the stop that ended it) and the seed that replays it; nothing in it depends on whether
drafts carried the generation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from exactdraft.drafters.checked import DrafterFaults
from exactdraft.errors import ParameterError
from exactdraft.models.target import backend_label
from exactdraft.sampling.keyed import TokenLogprob
from exactdraft.sampling.params import SamplingParams
from exactdraft.stops import StopMatcher

__all__ = ["Chunk", "GenerationResult", "GenerationStats", "Run", "receipt", "token_digest"]


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_passes: int = 0
    target_passes: int = 0  # decode and verify passes after the prefill
    drafted: int = 0
    accepted: int = 0
    tree_passes: int = 0  # verify passes over a token tree (drafted counts its nodes)
    forced: int = 0  # drafts that were a constraint's forced tokens (drafted counts them too)
    prefill_seconds: float = 0.0  # time to first token
    decode_seconds: float = 0.0
    drafting: bool = False
    drafting_note: str | None = None  # why drafting was off, when it was requested
    # What the drafter did wrong in this run (its bad drafts were dropped), by kind.
    drafter_faults: DrafterFaults = field(default_factory=DrafterFaults)
    # Where the prompt's first positions came from: "cold" (all computed), "memory" (the
    # engine's prefix cache, computed by this process), "file" (blocks of a prefix-cache file).
    prefix_cache: str = "cold"

    @property
    def wall_seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Tokens committed per target pass after the first token."""
        after_first = max(self.generated_tokens - 1, 0)
        return after_first / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first one per second of decoding."""
        after_first = max(self.generated_tokens - 1, 0)
        return after_first / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str | None
    # "stop", "length", "context", "interrupted" (Stream.result of a stream cut short), and
    # with a constraint "incomplete" (length or context reached before the constraint was
    # satisfied) or "unsatisfiable" (the constraint allowed no token, not even a stop token)
    finish_reason: str
    seed: int
    stats: GenerationStats
    prompt_tokens: list[int] = field(default_factory=list)
    stop: int | str | None = None  # the stop token or stop string that ended the run
    # One per token when logprobs were asked for (generate(..., logprobs=N)), else None.
    logprobs: list[TokenLogprob] | None = None

    def json(self) -> Any:
        """The text parsed as JSON (what a JSON-schema constraint guarantees once the run
        finished with "stop"); ParameterError naming the finish reason or the parse error."""
        if self.finish_reason in ("incomplete", "unsatisfiable", "interrupted"):
            raise ParameterError(f"the generation ended {self.finish_reason!r}: its text is "
                                 "not a complete value")
        try:
            return json.loads(self.text or "")
        except json.JSONDecodeError as error:
            raise ParameterError(f"the generated text is not JSON ({error}): "
                                 f"{(self.text or '')[:80]!r}") from error


@dataclass
class Chunk:
    """One step of a stream: tokens committed in that step and the text they complete."""

    tokens: list[int]
    text: str
    result: GenerationResult | None = None  # set on the last chunk
    logprobs: list[TokenLogprob] | None = None  # one per token, when asked for

    @property
    def finish_reason(self) -> str | None:
        return None if self.result is None else self.result.finish_reason


class Run:
    """The state of one generation, readable while it is under way: its checked request (the
    prompt ids, parameters with a resolved seed, the stop matcher, max_new_tokens, whether to
    draft, how many top logprobs to keep, the constraint's matcher if any) and what it has
    committed."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, stops: StopMatcher,
                 max_new_tokens: int, use_drafts: bool = True,
                 logprobs: int | None = None, matcher: Any = None) -> None:
        self.prompt_ids, self.params, self.stops = prompt_ids, params, stops
        self.max_new_tokens = max_new_tokens
        self.use_drafts = use_drafts
        self.logprobs = logprobs  # None: off; N: each token's logprob and the N most probable
        # A ConstraintMatcher at the start of the output (exactdraft.constraints), or None.
        self.matcher = matcher
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        self.output: list[int] = []
        self.token_logprobs: list[TokenLogprob] = []
        self.final: GenerationResult | None = None

    def with_seed(self, seed: int) -> Run:
        """A fresh run of the same request with another seed (and nothing committed)."""
        stops = StopMatcher(self.stops.strings, sorted(self.stops.tokens), self.stops.tokenizer)
        matcher = None if self.matcher is None else self.matcher.copy()
        return Run(self.prompt_ids, replace(self.params, seed=seed), stops, self.max_new_tokens,
                   self.use_drafts, self.logprobs, matcher)

    def result(self, reason: str) -> GenerationResult:
        self.stats.generated_tokens = len(self.output)
        logprobs = None if self.logprobs is None else \
            list(self.token_logprobs[:len(self.output)])
        return GenerationResult(tokens=list(self.output), text=self.stops.final_text(self.output),
                                finish_reason=reason, seed=self.params.seed, stats=self.stats,
                                prompt_tokens=list(self.prompt_ids), stop=self.stops.matched,
                                logprobs=logprobs)


def token_digest(tokens: Sequence[int]) -> str:
    """sha256 (hex) of token ids written as decimal numbers joined by commas: "1,2,3"."""
    return hashlib.sha256(",".join(str(int(t)) for t in tokens).encode()).hexdigest()


def receipt(target: Any, result: GenerationResult) -> dict[str, Any]:
    """What replays and proves a result: the digests of its prompt and tokens, its seed, how
    it was drafted, and the model's backend, arithmetic and weights digest (the server's
    `receipt` field and the CLI's --json print this)."""
    stats = result.stats
    return {"token_ids_sha256": token_digest(result.tokens),
            "prompt_ids_sha256": token_digest(result.prompt_tokens),
            "completion_tokens": len(result.tokens), "seed": result.seed,
            "drafting": stats.drafting, "drafted": stats.drafted, "accepted": stats.accepted,
            "prefix_cache": stats.prefix_cache, "backend": backend_label(target),
            "arithmetic": target.arithmetic, "weights_digest": target.weights_digest()}
