"""Generator: the drafted decoding loop, streaming, stop handling and statistics.

Invariant: for the same prompt, parameters and seed, `generate(..., drafts=True)` commits exactly
the tokens `generate(..., drafts=False)` commits. The loop body is exactdraft.decoding.Decoding
(shared with the engine, which puts many sequences in one pass): every committed token is the
target's own keyed sample (the Verifier keeps a draft only when it equals that sample), and every
stop condition is checked token by token on committed tokens, so a drafted run stops at the very
token where the serial run stops. Drafting runs only when the load-time guard has shown, on the
loaded weights, that a multi-row pass gives the bits of single steps; otherwise the Generator
runs serially and says so (or raises when strict).

Threads: a Generator may be shared. Each step of a generation (drafting, the model pass,
verification) runs under `Generator.lock`, so concurrent generate and stream calls interleave
step by step, never inside a step, and each returns exactly what it returns alone; they do not
run in parallel (an exactdraft.engine.Engine batches them into shared passes instead).
"""

from __future__ import annotations

import inspect
import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from exactdraft.arguments import (
    DO_SAMPLE,
    check_component,
    check_drafter,
    check_flags,
    check_pretrained_arguments,
    is_drafter_factory,
    request_options,
    sample_count,
    several_prompts,
    stops_with_config,
    token_ids_from_tensor,
)
from exactdraft.constraints.rows import FORCED_WINDOW, matcher_for
from exactdraft.decoding import Decoding, DecodingSetup
from exactdraft.drafters.base import Drafter, traits_of
from exactdraft.drafters.depth import DepthPolicy, measure_pass_costs
from exactdraft.errors import ExactnessError, ParameterError
from exactdraft.guard import check_row_invariance, check_tree_invariance
from exactdraft.models.target import (
    Pass,
    Target,
    capabilities_of,
    describe,
    run_pass,
)
from exactdraft.progress import Progress
from exactdraft.prompts import PromptInput, encode_prompt
from exactdraft.results import Chunk, GenerationResult, GenerationStats, Run
from exactdraft.sampling.keyed import MAX_TOP_LOGPROBS, KeyedSampler
from exactdraft.sampling.params import (
    SAMPLING_FIELDS,
    SamplingParams,
    positional_sampling,
    sampling_from,
)
from exactdraft.stops import StopMatcher, check_stop_tokens
from exactdraft.verify import ExactVerifier, Verifier

__all__ = ["Chunk", "GenerationResult", "GenerationStats", "Generator", "Run", "Stream"]


class Stream(Iterator[Chunk]):
    """What Generator.stream returns: the chunks of one generation, in order.

    Every chunk is the consumer's as soon as it is yielded. If the stream ends early (Ctrl-C
    inside the loop or in the consumer, an error, or `close()`), `result` still gives what was
    committed so far, with finish_reason "interrupted"; the Generator stays usable."""

    def __init__(self, run: Run, chunks: Iterator[Chunk]) -> None:
        self._run = run
        self._chunks = chunks

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Chunk:
        return next(self._chunks)

    def close(self) -> None:
        self._chunks.close()  # type: ignore[attr-defined]

    @property
    def result(self) -> GenerationResult:
        """The final result once the last chunk is out, else the result so far."""
        return self._run.final or self._run.result("interrupted")


_GENERATOR_OPTIONS = ("prefill_chunk", "adaptive_depth", "guard", "sampling", "stop_tokens")
_DEFAULT_MAX_NEW_TOKENS = 256


class Generator:
    """Target + Drafter + Verifier + Sampler, with drafted output equal to serial output."""

    def __init__(self, target: Target, drafter: Drafter | None = None,
                 verifier: Verifier | None = None, sampler: KeyedSampler | None = None,
                 tokenizer: Any | None = None, *, strict: bool = False,
                 prefill_chunk: int = 512, guard: bool = True, adaptive_depth: bool = True,
                 sampling: SamplingParams | Mapping[str, Any] | None = None,
                 stop_tokens: Sequence[int] | None = None,
                 progress: bool | None = None) -> None:
        """`guard=False` skips the load-time row-invariance check and drafts regardless; it
        exists for measuring exactness empirically (exactdraft check), not for production.
        `adaptive_depth` verifies only as many drafts as pay off, from verify-pass costs
        measured on the loaded model and the running acceptance (exactdraft.drafters.depth).
        `sampling` is the default for generate and stream (SamplingParams(): temperature 1.0,
        no filters), `stop_tokens` their default stop tokens (the tokenizer's eos and
        end-of-turn tokens, else the model's eos). `progress` shows the guard's work on stderr:
        None when stderr is a terminal, True always, False never."""
        check_component("target", target, ("vocab_size", "max_context", "new_state", "forward",
                                           "truncate"),
                        "a model (a Target); to load a checkpoint use "
                        "Generator.from_pretrained(path)")
        check_drafter(drafter)
        check_component("verifier", verifier, ("verify",), "a Verifier such as ExactVerifier()")
        check_component("sampler", sampler, ("sample", "sample_window"), "a KeyedSampler")
        check_component("tokenizer", tokenizer, ("encode", "decode"),
                        "a tokenizer with encode and decode")
        check_flags(strict=strict, prefill_chunk=prefill_chunk, guard=guard,
                    adaptive_depth=adaptive_depth, progress=progress)
        self.target = target
        self.drafter = drafter
        # Held for each step of a generation (the module docstring says what that promises).
        self.lock = threading.RLock()
        self.verifier = verifier or ExactVerifier()
        self.sampler = sampler or KeyedSampler()
        self.tokenizer = tokenizer
        self.strict = strict
        self.guard = guard
        self._forced_note: str | None = None  # the guard's verdict on forced-token passes
        self.prefill_chunk = prefill_chunk
        self.sampling = sampling_from(sampling, SamplingParams(), where="Generator")
        if stop_tokens is None:
            stop_tokens = getattr(tokenizer, "stop_token_ids", None) or \
                getattr(target, "eos_token_ids", ())
        self.stop_tokens = tuple(check_stop_tokens(stop_tokens, target.vocab_size))
        self.drafting_note: str | None = None
        self.depth_policy: DepthPolicy | None = None
        self.max_draft = 0
        # Whether drafts may be token trees: the drafter proposes them (tree_width > 1) and the
        # guard proved that a tree pass gives each row the bits of a serial step on its path.
        self.trees = False
        self.tree_note: str | None = None  # why trees are off when the drafter proposes them
        if drafter is None:
            return
        draft_vocab = traits_of(drafter).vocab_size or target.vocab_size
        if draft_vocab != target.vocab_size:
            raise ParameterError(f"the drafter's vocabulary ({draft_vocab}) differs from the "
                                 f"target's ({target.vocab_size})")
        # Read once: the guard proves windows up to this depth, and no pass goes wider.
        self.max_draft = drafter.max_draft
        window = self.max_draft + 1
        with Progress("preparing drafting", progress) as shown:
            if guard:
                shown.phase(f"load-time guard: do {window}-row passes equal single steps?")
                self.drafting_note = check_row_invariance(target, window)
            if self.drafting_note is None and traits_of(drafter).tree_width > 1:
                if guard:
                    shown.phase(f"load-time guard: do {self.max_draft}-node token trees "
                                "equal single steps?")
                    self.tree_note = check_tree_invariance(target, self.max_draft)
                elif not capabilities_of(target).verifies_trees:
                    self.tree_note = f"{target!r} cannot verify token trees in one pass"
                self.trees = self.tree_note is None
            if self.drafting_note is None and adaptive_depth:
                shown.phase("measuring verify-pass costs")
                self.depth_policy = DepthPolicy(measure_pass_costs(target, window),
                                                learn_pass_costs=True)
        if self.drafting_note is not None:
            message = f"drafting is off, output would not be exact: {self.drafting_note}"
            if strict:
                raise ExactnessError(message)
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        elif self.tree_note is not None:
            warnings.warn(f"token trees are off, drafts are verified as chains: "
                          f"{self.tree_note}", RuntimeWarning, stacklevel=2)

    @property
    def drafting_enabled(self) -> bool:
        return self.drafter is not None and self.drafting_note is None

    @classmethod
    def from_pretrained(cls, path_or_id: str | os.PathLike[str] | None = None,
                        backend: Any = "auto",
                        drafter: Drafter | Callable[[Target], Drafter] | None = None, *,
                        device: str | None = None, dtype: str | None = None,
                        max_context: int | None = None, strict: bool = False,
                        progress: bool | None = None,
                        chat_template: str | os.PathLike[str] | None = None,
                        **options: Any) -> Generator:
        """Load a checkpoint (folder, .gguf file or hub id; None = the bundled SmolLM2) and
        build a Generator with its tokenizer. `drafter` may also be a function of the target
        that returns the drafter, for drafters built on it (for example
        `lambda target: DraftHead.from_pretrained(None, target)`). `options` go to the loader
        (keep_quantized, revision, cache_dir, with_tokenizer) or to the Generator
        (prefill_chunk, adaptive_depth, guard, sampling, stop_tokens). The checkpoint's
        generation_config.json, when present, sets the default sampling (unless `sampling` is
        given) and adds its eos_token_id to the stop tokens. `chat_template` replaces the
        checkpoint's chat template (or gives one to a checkpoint without): a built-in's name
        ("gemma", "chatml", "harmony"), a Jinja file's path, or the template text. Every argument is
        checked before anything loads; `progress` shows the loading on stderr (None: when
        stderr is a terminal)."""
        from exactdraft import pretrained
        from exactdraft.backends.registry import get_backend

        named = [name for name in inspect.signature(cls.from_pretrained).parameters
                 if name not in ("path_or_id", "options")]
        pretrained.check_options(options, pretrained.LOADING_OPTIONS + _GENERATOR_OPTIONS,
                                 "from_pretrained", named)
        check_pretrained_arguments(path_or_id, backend, drafter, device, dtype, max_context)
        if chat_template is not None:
            from exactdraft.loading.builtin_templates import chat_template_source

            chat_template = chat_template_source(chat_template)
        own = {name: options.pop(name) for name in _GENERATOR_OPTIONS if name in options}
        check_flags(strict=strict, progress=progress, **{
            k: v for k, v in own.items() if k in ("prefill_chunk", "guard", "adaptive_depth")})
        if "sampling" in own:
            own["sampling"] = sampling_from(own["sampling"], SamplingParams(),
                                            where="from_pretrained")
        if own.get("stop_tokens") is not None:
            check_stop_tokens(own["stop_tokens"], None)
        where = "the bundled SmolLM2" if path_or_id is None else \
            os.path.basename(os.fspath(path_or_id).rstrip("/")) or os.fspath(path_or_id)
        with Progress(f"loading {where}", progress) as shown:
            if isinstance(backend, str):
                shown.phase(f"starting the {backend!r} backend")
                backend = get_backend(backend, device=device, dtype=dtype)
            shown.phase("reading the checkpoint")
            checkpoint = pretrained.load_checkpoint(path_or_id, **options)
            if chat_template is not None:
                if checkpoint.tokenizer is None:
                    raise ParameterError("chat_template needs a tokenizer, and this checkpoint "
                                         "was loaded without one")
                checkpoint.tokenizer.use_chat_template(chat_template)
            shown.phase("building the model")
            target = pretrained.build_target(checkpoint, backend, device=device, dtype=dtype,
                                             max_context=max_context)
        if is_drafter_factory(drafter):
            drafter = drafter(target)
        config = checkpoint.generation_config
        if config is not None:
            source = os.path.join(str(checkpoint.source), "generation_config.json")
            own.setdefault("sampling", SamplingParams.from_generation_config(config, source))
            if own.get("stop_tokens") is None:
                own["stop_tokens"] = stops_with_config(checkpoint.tokenizer, target, config,
                                                        source)
        return cls(target, drafter=drafter, tokenizer=checkpoint.tokenizer, strict=strict,
                   progress=progress, **own)

    def __repr__(self) -> str:
        if self.drafter is None:
            drafting = "serial"
        elif self.drafting_note is not None:
            drafting = f"drafting off: {self.drafting_note}"
        else:
            drafting = "drafting on" + (", trees" if self.trees else "")
        return (f"Generator({describe(self.target)}, "
                f"drafter={self.drafter!r}, {drafting})")

    def generate(self, prompt: PromptInput | Sequence[PromptInput],
                 max_new_tokens: int | None = None,
                 sampling: SamplingParams | Mapping[str, Any] | None = None,
                 **options: Any) -> GenerationResult | list[Any]:
        """Generate up to max_new_tokens (default 256; `max_tokens` is the same) after the
        prompt (text, token ids, chat messages, or a 1-D or [1, n] tensor of token ids).

        Keywords: `drafts=False` is the serial reference (the tokens are the same either way);
        `stop` (texts) and `stop_tokens` (ids, default: the model's); `logprobs=N` (0..20) puts
        in `result.logprobs` each token's logprob and the N most probable tokens, from the
        distribution its draw was made from (after bias, penalties, temperature and filters;
        see KeyedSampler.logprobs), the same bits drafted or not. `constraint` (an
        exactdraft.Constraint, a JSON schema dict, a pydantic model class, or a list of
        choices) limits the output to what it allows: its mask enters each draw (SAMPLER.md),
        the tokens it forces are verified as drafts, and `result.json()` parses a JSON result;
        logprobs are of the constrained distribution. Sampling is `sampling` (a
        SamplingParams, or a dict of its fields), or the fields given as keywords
        (temperature=0.7, top_p=0.9, seed=1, ...), not both; either way, fields not named keep
        the Generator's default (`self.sampling`: the checkpoint's generation_config.json when
        it has one, else SamplingParams(), temperature 1.0). A SamplingParams' max_tokens, stop
        and n apply when the call does not name them. Names from other libraries work too:
        do_sample=False (greedy), num_return_sequences, stop_strings, stop_token_ids,
        eos_token_id, repeat_penalty, temp, sampling_params; an unknown keyword raises
        ParameterError listing the valid ones.

        Returns a GenerationResult; with `n` > 1 a list of n of them (sample j's seed is
        exactdraft.engine.sample_seed(seed, j)); for a list of prompts a list with one entry
        per prompt, each equal to generate(that prompt, ...) with the same seed. Several
        prompts or samples run together through an exactdraft.engine.Engine (shared passes).

        Every argument is checked before the model runs; a bad one raises ParameterError (or
        TokenizerError for text) and the Generator stays usable. On Ctrl-C the
        KeyboardInterrupt propagates and the tokens of this call are dropped, the Generator
        stays usable; to keep a partial reply, iterate `stream()` and read its `result`."""
        max_new_tokens, sampling = positional_sampling(max_new_tokens, sampling)
        options = request_options(options, SAMPLING_FIELDS, "generate", sampling is not None)
        sampling = options.pop("sampling", sampling)  # passed as sampling_params=
        prompts = several_prompts(prompt)
        n = sample_count(options.pop("n", None), sampling, self.sampling.n)
        if isinstance(sampling, SamplingParams) and sampling.n != 1:
            sampling = replace(sampling, n=1)  # n is counted here, not in each sample's run
        elif isinstance(sampling, Mapping):
            sampling = {name: value for name, value in sampling.items() if name != "n"}
        if prompts is None and n == 1:
            run = self.prepare(prompt, max_new_tokens, sampling, where="generate", **options)
            # Only the final text is needed here, so the per-pass incremental decode is
            # skipped.
            for _ in self._chunks(run, stream_text=False):
                pass
            return run.final
        many = [prompt] if prompts is None else prompts
        for each in many:  # every prompt checked before anything runs
            self.prepare(each, max_new_tokens, sampling, where="generate", **options)
        from exactdraft.engine.scheduler import Engine

        with Engine(self, max_sequences=max(n, min(len(many) * n, 8)),
                    max_waiting=len(many)) as engine:
            results = engine.generate_batch(many, n=n, max_new_tokens=max_new_tokens,
                                            sampling=sampling, **options)
        grouped = [results[i * n:(i + 1) * n] if n > 1 else results[i]
                   for i in range(len(many))]
        return grouped[0] if prompts is None else grouped

    def stream(self, prompt: PromptInput, max_new_tokens: int | None = None,
               sampling: SamplingParams | Mapping[str, Any] | None = None,
               **options: Any) -> Stream:
        """Like generate for one prompt and one sample (the same keywords, checked before
        anything runs), yielding the tokens and text committed at each target pass (and their
        logprobs when asked for); the last chunk carries the full result. Text that could
        still grow into a stop string is held back until it cannot. A stream cut short
        (Ctrl-C, close()) keeps what it yielded, and its `result` is the partial result
        (finish_reason "interrupted")."""
        max_new_tokens, sampling = positional_sampling(max_new_tokens, sampling)
        options = request_options(options, SAMPLING_FIELDS, "stream", sampling is not None)
        sampling = options.pop("sampling", sampling)  # passed as sampling_params=
        if several_prompts(prompt) is not None:
            raise ParameterError("stream() takes one prompt; for several, use generate(list) "
                                 "or an exactdraft.engine.Engine")
        n = sample_count(options.pop("n", None), sampling, self.sampling.n)
        if n != 1:
            raise ParameterError(f"stream() makes one sample, got n={n}; use generate(n=...) "
                                 "or an exactdraft.engine.Engine")
        run = self.prepare(prompt, max_new_tokens, sampling, where="stream", **options)
        return Stream(run, self._chunks(run, stream_text=True))

    def prepare(self, prompt: PromptInput, max_new_tokens: int | None = None,
                sampling: SamplingParams | Mapping[str, Any] | None = None, *,
                where: str = "generate", **options: Any) -> Run:
        """A checked request for one sample that has not run yet: generate's arguments, every
        one checked, the seed resolved. Raises ParameterError (TokenizerError for text) naming
        the argument; nothing runs."""
        options = request_options(options, SAMPLING_FIELDS, where, sampling is not None)
        sampling = options.pop("sampling", sampling)  # passed as sampling_params=
        shorthand = {name: options.pop(name) for name in SAMPLING_FIELDS if name in options}
        max_tokens = options.pop("max_tokens", None)
        do_sample = options.pop(DO_SAMPLE, None)
        stop, stop_tokens = options.pop("stop", None), options.pop("stop_tokens", None)
        drafts, logprobs = options.pop("drafts", True), options.pop("logprobs", None)
        constraint = options.pop("constraint", None)
        if options.pop("n", 1) not in (1, None):
            raise ParameterError(f"{where}() makes one sample; n is generate's (or "
                                 "Engine.submit's)")
        if max_new_tokens is not None and max_tokens is not None:
            raise ParameterError(f"{where}() got both max_new_tokens= and max_tokens= (the "
                                 "same setting); pass one")
        if drafts not in (True, False):
            raise ParameterError(f"drafts must be True or False, got {drafts!r}")
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
            raise ParameterError(f"logprobs must be None or an integer in "
                                 f"[0, {MAX_TOP_LOGPROBS}], got {logprobs!r}")
        params = sampling_from(sampling, self.sampling, shorthand, where)
        if do_sample and params.temperature == 0:
            raise ParameterError(f"{where}() got do_sample=True but the temperature is 0 "
                                 "(greedy); pass temperature= > 0")
        if sample_count(None, sampling) != 1:
            raise ParameterError(f"{where}() makes one sample, but the sampling asks for "
                                 f"n={sample_count(None, sampling)}; n is generate's (or "
                                 "Engine.submit's)")
        limit = max_tokens if max_new_tokens is None else max_new_tokens
        named = "max_tokens" if max_tokens is not None else "max_new_tokens"
        if limit is None:
            limit, named = params.max_tokens, "max_tokens"
        limit = _DEFAULT_MAX_NEW_TOKENS if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ParameterError(f"{named} must be an integer >= 0, got {limit!r}")
        if stop is None:
            stop = params.stop
        params = params.without_request().with_seed()
        vocab = self.target.vocab_size
        for token in params.logit_bias:
            if token >= vocab:
                raise ParameterError(f"logit_bias token id {token} is outside the vocabulary "
                                     f"[0, {vocab})")
        prompt_ids = encode_prompt(token_ids_from_tensor(prompt), self.tokenizer, vocab)
        if len(prompt_ids) >= self.target.max_context:
            raise ParameterError(f"the prompt has {len(prompt_ids)} tokens, which leaves no "
                                 f"room in the model's context of {self.target.max_context}")
        stops = StopMatcher(stop, self.stop_tokens if stop_tokens is None else stop_tokens,
                            self.tokenizer, vocab)
        matcher = None if constraint is None else \
            matcher_for(constraint, self.tokenizer, vocab, sorted(stops.tokens))
        return Run(prompt_ids, params, stops, limit, bool(drafts), logprobs, matcher)

    def decoding_setup(self, run: Run) -> DecodingSetup:
        """What `run` reads of this Generator (its parts and its guard's decisions)."""
        forced = self.forced_window() if run.matcher is not None else 0
        return DecodingSetup(self.target, self.verifier, self.sampler, self.prefill_chunk,
                             self.drafter, self.drafting_note, self.max_draft, self.trees,
                             self.depth_policy, forced)

    def forced_window(self) -> int:
        """How many tokens a constraint forces may be verified in one pass: the wider of the
        drafter's proven window and FORCED_WINDOW, a window the guard proves on first use
        (else the drafter's alone); 0 where the guard found the drafter's passes inexact."""
        if self.drafter is not None and not self.drafting_enabled:
            return 0
        if self.max_draft >= FORCED_WINDOW:
            return self.max_draft
        if self._forced_note is None:
            note = check_row_invariance(self.target, FORCED_WINDOW + 1) if self.guard else None
            self._forced_note = note or ""
        return self.max_draft if self._forced_note else FORCED_WINDOW

    def _chunks(self, run: Run, stream_text: bool) -> Iterator[Chunk]:
        """One sequence, one pass at a time; each step runs under the lock."""
        decoding = Decoding(self.decoding_setup(run), run, stream_text)
        # A drafter that reads the target's features gets them with every pass's logits.
        features = decoding.wants_features
        while not decoding.finished:
            with self.lock:
                if decoding.plan():
                    rows = run_pass(self.target, Pass([decoding.part()], decoding.rows,
                                                      features))[0]
                    chunk = decoding.advance(rows.logits, rows.features)
                else:  # max_new_tokens 0: nothing to run
                    chunk = decoding.advance(None)
            if chunk is not None:
                yield chunk
