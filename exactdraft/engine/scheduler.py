"""Engine: many generations of one Generator, several sequences per target pass.

Invariant: every sample writes exactly the tokens (and logprobs) it writes when run alone with
Generator.generate, serially or drafted, whatever shares its passes, when it joins or leaves,
how its prompt is cut into chunks and whether its prefix came from the prefix cache. Each
sample is its own exactdraft.decoding.Decoding (the Generator's loop body) over its own state;
a pass appends every participant's tokens in one `forward_batch`, which gives each row the bits
of its sequence alone, and each Decoding then decides and commits from its own rows. Where the
Generator verifies token trees, a sample's drafts may be a tree: its rows in the shared pass
are that tree's (forward_batch's `parents`), as forward_tree gives them alone.

Scheduling (continuous batching): between passes, waiting requests join (up to
`max_sequences` sequences) and finished or cancelled ones leave. A pass holds every decoding
sequence and prompt chunks of prefilling ones, `max_pass_tokens` prompt tokens at most. A pass
with prompt chunks keeps only each sequence's last row, so its decoding sequences verify no
drafts in that pass (drafts change speed only). A target that does not declare
`batches_sequences` runs one sequence per pass, in turn.

Failures: a request's own failure (its decoding raised) fails that request alone. Any other
failure of the scheduling loop (a pass of the target that raised, a target that reports it can
no longer run, as a tensor-parallel target does for a dead or hung rank even between requests,
a bug in the loop) stops the engine for good: `failure` becomes an EngineFailed naming the cause,
every waiting and running request fails with it, `submit` raises it, and `on_failure` is called
once (a server turns unhealthy and exits). The worker never ends silently.

Threads: one worker thread runs the passes, under the Generator's lock (so a Generator used
directly meanwhile interleaves pass by pass); submit, cancel and the result readers may be
called from any thread or asyncio task.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactdraft.arguments import checked_sample_count
from exactdraft.decoding import Decoding, RunSource
from exactdraft.drafters.base import traits_of
from exactdraft.engine.prefix_cache import Block, PrefixCache
from exactdraft.engine.submission import EngineFailed, QueueFull, Submission, sample_seed
from exactdraft.errors import ParameterError
from exactdraft.models.target import Pass, PassRows, capabilities_of, run_pass
from exactdraft.prompts import PromptInput
from exactdraft.results import Chunk, GenerationResult


@dataclass
class EngineStats:
    passes: int = 0
    rows: int = 0  # rows of all passes
    mixed_passes: int = 0  # passes holding prompt chunks and decoding rows together
    cancelled: int = 0  # samples stopped because their request was cancelled
    sequences_per_pass: list[int] = field(default_factory=list, repr=False)


@dataclass(eq=False)
class _Sample:
    submission: Submission
    index: int
    decoding: Decoding
    blocks: list[Block]  # prefix-cache blocks this sample holds
    shared_drafter: bool = False  # drafts with the Generator's own drafter


class Engine:
    """Serves many requests from one Generator with shared passes (the module docstring)."""

    def __init__(self, generator: RunSource, *, max_sequences: int = 8,
                 max_pass_tokens: int | None = None, max_waiting: int = 64,
                 prefix_cache: PrefixCache | None = None,
                 on_failure: Callable[[EngineFailed], None] | None = None,
                 watch_s: float = 0.5) -> None:
        """`max_sequences`: sequences sharing a pass; `max_pass_tokens`: prompt tokens per
        pass (default: the Generator's prefill_chunk); `max_waiting`: requests queued beyond
        those, after which submit raises QueueFull; `prefix_cache`: where prompt prefixes are
        kept (used only when the target declares `kv_prefixes`); `on_failure`: called once,
        from the worker thread, when the engine stops after a failure; `watch_s`: how often
        an idle engine asks a target that `spans_ranks` whether it can still run."""
        if not all(hasattr(generator, name) for name in ("prepare", "target", "lock")):
            raise ParameterError(f"Engine needs a Generator, got {type(generator).__name__}")
        for name, value in (("max_sequences", max_sequences), ("max_waiting", max_waiting),
                            ("max_pass_tokens", max_pass_tokens or 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParameterError(f"{name} must be an integer >= 1, got {value!r}")
        if isinstance(watch_s, bool) or not isinstance(watch_s, (int, float)) or \
                not watch_s > 0:
            raise ParameterError(f"watch_s must be a positive number of seconds, got "
                                 f"{watch_s!r}")
        self.generator = generator
        self.target = generator.target
        self.max_sequences = max_sequences
        self.max_pass_tokens = max_pass_tokens or generator.prefill_chunk
        self.max_waiting = max_waiting
        # Declared capabilities of the target, read once (never probed by calling).
        can = capabilities_of(self.target)
        self.batched = can.batches_sequences
        self.prefix_cache = prefix_cache if can.kv_prefixes else None
        self.stats = EngineStats()
        self.failure: EngineFailed | None = None  # set once, when the engine stops failing
        self.on_failure = on_failure
        self.watch_s = watch_s
        self._watch = self.target.check if can.spans_ranks else None
        self._waiting: deque[Submission] = deque()
        self._running: list[_Sample] = []
        self._turn = 0
        self._shared_drafter_busy = False
        self._closed = False
        self._wake = threading.Condition()
        self._worker = threading.Thread(target=self._work, name="exactdraft-engine",
                                        daemon=True)
        self._worker.start()

    # -- the public API ----------------------------------------------------------------------

    def submit(self, prompt: PromptInput, *, n: int = 1, **options: Any) -> Submission:
        """Queue one request of `n` samples (Generator.generate's keywords in `options`),
        checked before it is queued (ParameterError naming the argument). Sample j runs with
        seed sample_seed(seed, j), reported in its result. QueueFull when the queue is full."""
        n = checked_sample_count(n, self.max_sequences)
        first = self.generator.prepare(prompt, where="submit", **options)
        runs = [first] + [first.with_seed(sample_seed(first.params.seed, j))
                          for j in range(1, n)]
        submission = Submission(runs)
        with self._wake:
            if self.failure is not None:
                raise self.failure
            if self._closed:
                raise ParameterError("the engine is closed")
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (max_waiting="
                                f"{self.max_waiting}); try again later")
            self._waiting.append(submission)
            self._wake.notify()
        return submission

    def generate_batch(self, prompts: Sequence[PromptInput], *, n: int = 1,
                       **options: Any) -> list[GenerationResult]:
        """Every prompt's `n` samples, run together: results[i * n + j] is sample j of prompt
        i, each equal to Generator.generate of that prompt with its seed."""
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise ParameterError("generate_batch takes a list of prompts")
        submissions = []
        try:
            for prompt in prompts:
                submissions.append(self.submit(prompt, n=n, **options))
            return [result for s in submissions for result in s.results()]
        finally:
            for submission in submissions:
                submission.cancel()  # a no-op for finished ones; stops the rest on an error

    async def stream(self, prompt: PromptInput, **options: Any) -> AsyncIterator[Chunk]:
        """One sample's chunks as an async iterator; leaving the loop early cancels it."""
        submission = self.submit(prompt, **options)
        try:
            async for _, chunk in submission:
                yield chunk
        finally:
            submission.cancel()

    def close(self) -> None:
        """Stop the worker after the pass under way; waiting and running requests fail."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._worker.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def load(self) -> tuple[int, int]:
        """(running samples, waiting requests)."""
        return len(self._running), len(self._waiting)

    # -- the worker ----------------------------------------------------------------------------

    def _work(self) -> None:
        try:
            self._loop()
        except BaseException as error:  # noqa: BLE001  (any failure stops the engine, aloud)
            self._stop_failing(error)
            return
        self._fail_all(ParameterError("the engine was closed before this request finished"))

    def _loop(self) -> None:
        watch = self._watch
        while True:
            with self._wake:
                while not self._waiting and not self._running and not self._closed:
                    if watch is not None:
                        watch()
                    self._wake.wait(None if watch is None else self.watch_s)
                if self._closed:
                    return
            if watch is not None:
                watch()
            with self.generator.lock:
                self._admit()
                self._step()

    def _stop_failing(self, error: BaseException) -> None:
        cause = str(error) if isinstance(error, EngineFailed) else \
            f"the engine stopped: {type(error).__name__}: {error}"
        failure = EngineFailed(cause)
        failure.__cause__ = error
        with self._wake:
            self.failure = failure
            self._closed = True
        self._fail_all(failure)
        if self.on_failure is not None:
            self.on_failure(failure)

    def _fail_all(self, error: BaseException) -> None:
        with self._wake:
            waiting = list(self._waiting)
            self._waiting.clear()
        for sample in list(self._running):
            sample.submission.fail(error)
            self._leave(sample)  # frees its prefix-cache blocks; load counts it no more
        for submission in waiting:
            submission.fail(error)

    def _admit(self) -> None:
        """Start waiting requests while their samples fit in max_sequences (a request's
        samples start together)."""
        while True:
            with self._wake:
                if not self._waiting or \
                        len(self._running) + len(self._waiting[0].runs) > self.max_sequences:
                    return
                submission = self._waiting.popleft()
            if submission.cancelled:
                submission.stop()
                continue
            try:
                for index, run in enumerate(submission.runs):
                    self._running.append(self._start(submission, index, run))
            except BaseException:
                with self._wake:  # so the failure that stops the engine reaches it too
                    self._waiting.appendleft(submission)
                raise

    def _start(self, submission: Submission, index: int, run: Any) -> _Sample:
        target, generator = self.target, self.generator
        state = target.new_state()
        blocks: list[Block] = []
        if self.prefix_cache is not None:
            # At least one prompt token is left to run: its row gives the first token.
            blocks = self.prefix_cache.acquire(run.prompt_ids[:-1])
            submission.cached_tokens[index] = sum(len(b.tokens) for b in blocks)
            run.stats.prefix_cache = "file" if any(b.from_file for b in blocks) else \
                "memory" if blocks else "cold"
            if blocks:
                stack = [b.keys for b in blocks], [b.values for b in blocks]
                target.import_kv(state, *(_along_positions(arrays) for arrays in stack))
        drafter, shared = None, False
        if generator.drafter is not None and run.use_drafts:
            # A drafter whose state is plain data declares it (copies_per_sequence).
            if traits_of(generator.drafter).copies_per_sequence:
                drafter = copy.deepcopy(generator.drafter)
            elif not self._shared_drafter_busy:
                self._shared_drafter_busy = shared = True
            else:  # a drafter with a model serves one sequence at a time: speed only
                run.use_drafts = False
        # A shared pass's time is not this sample's: its policy keeps the measured costs.
        decoding = Decoding(generator.decoding_setup(run), run, stream_text=True, state=state,
                            drafter=drafter, timed_passes=False)
        return _Sample(submission, index, decoding, blocks, shared)

    def _step(self) -> None:
        for sample in [s for s in self._running if s.submission.cancelled]:
            self._leave(sample)
            self.stats.cancelled += 1
            if not any(s.submission is sample.submission for s in self._running):
                sample.submission.stop()
        if not self._running:
            return
        group = self._running if self.batched else \
            [self._running[self._turn % len(self._running)]]
        self._turn += 1
        planned: list[tuple[_Sample, list[int]]] = []
        budget = self.max_pass_tokens
        for sample in group:  # prompt chunks first: whether there are any decides the rows
            if sample.decoding.prefilling and budget > 0:
                tokens = sample.decoding.plan(max_tokens=budget)
                budget -= len(tokens)
                planned.append((sample, tokens))
        mixed = bool(planned)
        decoders = [s for s in group if not s.decoding.prefilling]
        for sample in decoders:  # trees where the Generator verifies them (its guard ran)
            planned.append((sample, sample.decoding.plan(drafts=not mixed)))
        self.stats.mixed_passes += bool(mixed and decoders)
        passing = [(s, t) for s, t in planned if t]
        # A pass that raises leaves the target's states unknown: it stops the engine (_work).
        rows = self._forward(passing, "last" if mixed else "all") if passing else []
        for sample, tokens in planned:
            if not tokens:
                self._advance(sample, None)
        for (sample, _), out in zip(passing, rows):
            self._advance(sample, out.logits, out.features)

    def _forward(self, passing: list[tuple[_Sample, list[int]]], rows: str) -> list[PassRows]:
        """Each passing sample's rows (with features when any sample's drafter reads them:
        then every sample gets its own)."""
        self.stats.passes += 1
        self.stats.rows += sum(len(t) for _, t in passing)
        self.stats.sequences_per_pass.append(len(passing))
        # Only targets that declare returns_features are asked for them (Decoding checks).
        features = any(s.decoding.wants_features for s, _ in passing)
        return run_pass(self.target, Pass([s.decoding.part() for s, _ in passing], rows,
                                          features))

    def _advance(self, sample: _Sample, logits: Any, features: Any = None) -> None:
        decoding = sample.decoding
        was_prefilling = decoding.prefilling
        try:
            chunk = decoding.advance(logits, features)
        except Exception as error:
            self._fail(sample, error)
            return
        if was_prefilling and not decoding.prefilling and self.prefix_cache is not None:
            sample.blocks = self.prefix_cache.store(self.target, decoding.state,
                                                    decoding.run.prompt_ids, sample.blocks)
        if chunk is not None:
            sample.submission.deliver(sample.index, chunk)
        if decoding.finished:
            if self.prefix_cache is not None:  # the reply too, for the next turn of a chat
                sample.blocks = self.prefix_cache.store(self.target, decoding.state,
                                                        decoding.sequence, sample.blocks)
            self._leave(sample)

    def _fail(self, sample: _Sample, error: BaseException) -> None:
        sample.submission.fail(error)
        for other in [s for s in self._running if s.submission is sample.submission]:
            self._leave(other)

    def _leave(self, sample: _Sample) -> None:
        if sample in self._running:
            self._running.remove(sample)
        if self.prefix_cache is not None:
            self.prefix_cache.release(sample.blocks)
        sample.blocks = []
        if sample.shared_drafter:
            self._shared_drafter_busy = False


def _along_positions(arrays: list[np.ndarray]) -> np.ndarray:
    return np.ascontiguousarray(np.concatenate(arrays, axis=2))
