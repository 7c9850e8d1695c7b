"""Generator: the drafted decoding loop, streaming, stop handling and statistics.

Invariant: for the same prompt, parameters and seed, `generate(..., drafts=True)` commits exactly
the tokens `generate(..., drafts=False)` commits. Every committed token is the target's own keyed
sample (the Verifier keeps a draft only when it equals that sample), and every stop condition
(stop token, stop string, max_new_tokens, context length) is checked token by token on committed
tokens, so a drafted run stops at the very token where the serial run stops. Drafting runs only
when the load-time guard has shown, on the loaded weights, that a multi-row pass gives the bits
of single steps; otherwise the Generator runs serially and says so (or raises when strict).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from exactdraft.depth import DepthPolicy, measure_pass_costs
from exactdraft.drafters.base import DraftContext, Drafter
from exactdraft.errors import ExactnessError, ParameterError
from exactdraft.guard import check_row_invariance
from exactdraft.models.target import Target
from exactdraft.prompts import PromptInput, encode_prompt
from exactdraft.sampling import KeyedSampler, SamplingParams
from exactdraft.stops import StopMatcher
from exactdraft.verify import ExactVerifier, Verifier


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_passes: int = 0
    target_passes: int = 0  # decode and verify passes after the prefill
    drafted: int = 0
    accepted: int = 0
    prefill_seconds: float = 0.0  # time to first token
    decode_seconds: float = 0.0
    drafting: bool = False
    drafting_note: str | None = None  # why drafting was off, when it was requested

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
    finish_reason: str  # "stop", "length" or "context"
    seed: int
    stats: GenerationStats
    prompt_tokens: list[int] = field(default_factory=list)
    stop: int | str | None = None  # the stop token or stop string that ended the run


@dataclass
class Chunk:
    """One step of a stream: tokens committed in that step and the text they complete."""

    tokens: list[int]
    text: str
    result: GenerationResult | None = None  # set on the last chunk

    @property
    def finish_reason(self) -> str | None:
        return None if self.result is None else self.result.finish_reason


class Generator:
    """Target + Drafter + Verifier + Sampler, with drafted output equal to serial output."""

    def __init__(self, target: Target, drafter: Drafter | None = None,
                 verifier: Verifier | None = None, sampler: KeyedSampler | None = None,
                 tokenizer: Any | None = None, *, strict: bool = False,
                 prefill_chunk: int = 512, guard: bool = True,
                 adaptive_depth: bool = True) -> None:
        """`guard=False` skips the load-time row-invariance check and drafts regardless; it
        exists for measuring exactness empirically (exactdraft check), not for production.
        `adaptive_depth` verifies only as many drafts as pay off, from verify-pass costs
        measured on the loaded model and the running acceptance (exactdraft.depth)."""
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) \
                or prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be an integer >= 1, got {prefill_chunk!r}")
        self.target = target
        self.drafter = drafter
        self.verifier = verifier or ExactVerifier()
        self.sampler = sampler or KeyedSampler()
        self.tokenizer = tokenizer
        self.strict = strict
        self.prefill_chunk = prefill_chunk
        self.drafting_note: str | None = None
        if drafter is not None:
            draft_vocab = getattr(drafter, "vocab_size", target.vocab_size)
            if draft_vocab != target.vocab_size:
                raise ValueError(f"the drafter's vocabulary ({draft_vocab}) differs from the "
                                 f"target's ({target.vocab_size})")
            if guard:
                self.drafting_note = check_row_invariance(target, drafter.max_draft + 1)
            if self.drafting_note is not None:
                message = f"drafting is off, output would not be exact: {self.drafting_note}"
                if strict:
                    raise ExactnessError(message)
                warnings.warn(message, RuntimeWarning, stacklevel=2)
        self.depth_policy: DepthPolicy | None = None
        if self.drafting_enabled and adaptive_depth:
            self.depth_policy = DepthPolicy(measure_pass_costs(target, drafter.max_draft + 1))

    @property
    def drafting_enabled(self) -> bool:
        return self.drafter is not None and self.drafting_note is None

    @classmethod
    def from_pretrained(cls, path_or_id: str | None = None, backend: Any = "auto",
                        drafter: Drafter | None = None, *, device: str | None = None,
                        dtype: str | None = None, max_context: int | None = None,
                        strict: bool = False, **options: Any) -> Generator:
        """Load a checkpoint (folder, .gguf file or hub id; None = the bundled SmolLM2) and
        build a Generator with its tokenizer. `options` go to the loader (keep_quantized,
        revision, cache_dir, with_tokenizer) or to the Generator (prefill_chunk,
        adaptive_depth)."""
        from exactdraft import pretrained

        generator_options = ("prefill_chunk", "adaptive_depth", "guard")
        pretrained.check_options(options, pretrained.LOADING_OPTIONS + generator_options,
                                 "from_pretrained")
        if not isinstance(backend, str) and hasattr(backend, "propose"):
            raise ParameterError(f"from_pretrained got a drafter ({backend!r}) as `backend`; "
                                 "pass it as drafter=...")
        own = {name: options.pop(name) for name in generator_options if name in options}
        checkpoint = pretrained.load_checkpoint(path_or_id, **options)
        target = pretrained.build_target(checkpoint, backend, device=device, dtype=dtype,
                                         max_context=max_context)
        return cls(target, drafter=drafter, tokenizer=checkpoint.tokenizer, strict=strict,
                   **own)

    def generate(self, prompt: PromptInput, max_new_tokens: int = 256,
                 sampling: SamplingParams | None = None, *, stop: str | Sequence[str] = (),
                 stop_tokens: Sequence[int] | None = None, drafts: bool = True) -> GenerationResult:
        """Generate up to max_new_tokens after the prompt (text, token ids or chat messages).
        `drafts=False` is the serial reference; the tokens are the same either way."""
        # Only the final text is needed here, so the per-pass incremental decode is skipped.
        *_, last = self._run(*self._prepare(prompt, max_new_tokens, sampling, stop, stop_tokens),
                             drafts, stream_text=False)
        return last.result

    def stream(self, prompt: PromptInput, max_new_tokens: int = 256,
               sampling: SamplingParams | None = None, *, stop: str | Sequence[str] = (),
               stop_tokens: Sequence[int] | None = None,
               drafts: bool = True) -> Iterator[Chunk]:
        """Like generate, yielding the tokens and text committed at each target pass; the last
        chunk carries the full result. Text that could still grow into a stop string is held
        back until it cannot."""
        return self._run(*self._prepare(prompt, max_new_tokens, sampling, stop, stop_tokens),
                         drafts, stream_text=True)

    def _prepare(self, prompt: PromptInput, max_new_tokens: int,
                 sampling: SamplingParams | None, stop: str | Sequence[str],
                 stop_tokens: Sequence[int] | None
                 ) -> tuple[list[int], int, SamplingParams, StopMatcher]:
        """Checked prompt ids, max_new_tokens, parameters with a seed, and the stop matcher."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
                or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        params = (sampling or SamplingParams()).with_seed()
        prompt_ids = encode_prompt(prompt, self.tokenizer, self.target.vocab_size)
        if len(prompt_ids) >= self.target.max_context:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens, which leaves no room in "
                             f"the model's context of {self.target.max_context}")
        if stop_tokens is None:
            stop_tokens = getattr(self.tokenizer, "stop_token_ids", None) or \
                self.target.eos_token_ids
        return prompt_ids, max_new_tokens, params, StopMatcher(stop, stop_tokens, self.tokenizer)

    def _run(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams,
             stops: StopMatcher, use_drafts: bool, stream_text: bool) -> Iterator[Chunk]:
        target, sampler = self.target, self.sampler
        n_prompt = len(prompt_ids)
        drafter = self.drafter if use_drafts and self.drafting_enabled else None
        stats = GenerationStats(prompt_tokens=n_prompt, drafting=drafter is not None,
                                drafting_note=self.drafting_note if use_drafts else None)
        sequence = list(prompt_ids)
        output: list[int] = []
        # Timings cover the model's work only, not the time a stream's consumer holds a chunk.

        def result(reason: str) -> GenerationResult:
            stats.generated_tokens = len(output)
            return GenerationResult(tokens=list(output), text=stops.final_text(output),
                                    finish_reason=reason, seed=params.seed, stats=stats,
                                    prompt_tokens=prompt_ids, stop=stops.matched)

        if max_new_tokens == 0:
            yield Chunk(tokens=[], text="", result=result("length"))
            return
        clock = time.perf_counter()
        state = target.new_state()
        for begin in range(0, n_prompt, self.prefill_chunk):
            logits = target.forward(state, prompt_ids[begin:begin + self.prefill_chunk])
            stats.prefill_passes += 1
        pending = [sampler.sample(logits[-1], params, pos=n_prompt, history=sequence,
                                  n_prompt=n_prompt)]
        stats.prefill_seconds = time.perf_counter() - clock
        policy = self.depth_policy if drafter is not None else None
        if drafter is not None:
            drafter.begin(prompt_ids, DraftContext(params, sampler, n_prompt))
        if policy is not None:
            policy.reset()
        while True:
            committed, reason = [], None
            for token in pending:
                sequence.append(token)
                output.append(token)
                committed.append(token)
                reason = stops.check(output)
                if reason is None and len(output) == max_new_tokens:
                    reason = "length"
                if reason is None and len(sequence) == target.max_context:
                    reason = "context"
                if reason is not None:
                    break
            if reason is not None:
                text = stops.new_text(output, final=True) if stream_text else ""
                yield Chunk(tokens=committed, text=text, result=result(reason))
                return
            yield Chunk(tokens=committed, text=stops.new_text(output) if stream_text else "")
            clock = time.perf_counter()
            limit = min(max_new_tokens - len(output), target.max_context - len(sequence)) - 1
            if policy is not None:
                limit = policy.depth(limit)
            proposed: list[int] = []
            if drafter is not None and limit > 0:
                proposed = [int(t) for t in drafter.propose(sequence, limit)[:limit]]
            verdict = self.verifier.verify(target, state, proposed, sampler=sampler,
                                           params=params, history=sequence, n_prompt=n_prompt)
            stats.target_passes += 1
            if proposed:
                stats.drafted += len(proposed)
                stats.accepted += verdict.accepted
                drafter.accepted(len(proposed), verdict.accepted)
            if policy is not None:
                policy.record(len(proposed), verdict.accepted)
            pending = [*proposed[:verdict.accepted], verdict.token]
            stats.decode_seconds += time.perf_counter() - clock
