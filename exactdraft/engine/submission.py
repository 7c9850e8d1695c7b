"""Submission: one request in the engine, its `n` samples, and how their chunks reach the caller.

Invariant: every chunk a sample commits reaches the caller exactly once and in order (as
`(sample index, chunk)`), whether it is read from a thread (`events`, `results`) or from an
asyncio task (`async for`); after the last chunk of every sample, or an error, the submission is
done and nothing more arrives. Sample j's seed is `sample_seed(seed, j)`, reported in its result,
so each sample replays alone with that seed. Cancelling stops the samples at the engine's next
pass and frees what they hold; their results are then partial ("interrupted").
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator
from typing import Any

from exactdraft.errors import ExactdraftError
from exactdraft.results import Chunk, GenerationResult, Run
from exactdraft.sampling.keyed import noise_key

# A position no token ever reaches, so a derived seed is no one's noise key at a real position.
_SEED_POSITION = 2**64 - 1


class QueueFull(ExactdraftError, RuntimeError):
    """The engine's queue of waiting requests is full; try again later."""


class EngineFailed(ExactdraftError, RuntimeError):
    """The engine stopped after a failure of its scheduling loop or its target (a dead
    tensor-parallel rank, a pass that raised); the message names the cause. No request runs
    on it again."""


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample `index` of a request with `seed`: the seed itself for sample 0, so a
    request for one sample is the plain request; SAMPLER.md's key(seed, 2**64 - 1, index)
    for the others."""
    return seed if index == 0 else noise_key(seed, _SEED_POSITION, index)


class Submission:
    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs
        self.seeds = [run.params.seed for run in runs]
        # Per sample, the prompt positions its start took from the prefix cache (set by the
        # engine when the sample starts; read-only for callers).
        self.cached_tokens = [0] * len(runs)
        self.cancelled = False
        self.error: BaseException | None = None
        self._events: deque[tuple[int, Chunk]] = deque()
        self._open = len(runs)  # samples not finished
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def done(self) -> bool:
        return self._open == 0 or self.error is not None

    def cancel(self) -> None:
        """Stop every sample at the next pass (a client that went away)."""
        self.cancelled = True

    # -- the engine's side -------------------------------------------------------------------

    def deliver(self, index: int, chunk: Chunk) -> None:
        with self._lock:
            self._events.append((index, chunk))
            if chunk.result is not None:
                self._open -= 1
            self._wake()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
            self._wake()

    def stop(self) -> None:
        """The engine dropped the cancelled samples: the submission is over."""
        with self._lock:
            self._open = 0
            self._wake()

    def _wake(self) -> None:
        self._changed.notify_all()
        for loop, future in self._waiters:
            loop.call_soon_threadsafe(_resolve, future)
        self._waiters.clear()

    # -- the caller's side -------------------------------------------------------------------

    def events(self, timeout: float | None = None) -> Iterator[tuple[int, Chunk]]:
        """(sample index, chunk) in commit order, blocking the thread between them."""
        while True:
            with self._lock:
                while not self._events and not self.done:
                    if not self._changed.wait(timeout):
                        raise TimeoutError(f"no chunk within {timeout} s")
                if self._events:
                    event = self._events.popleft()
                elif self.error is not None:
                    raise self.error
                else:
                    return
            yield event

    def results(self, timeout: float | None = None) -> list[GenerationResult]:
        """Every sample's result, once all are done (partial ones if cancelled)."""
        for _ in self.events(timeout):
            pass
        return [run.final or run.result("interrupted") for run in self.runs]

    def __aiter__(self) -> AsyncIterator[tuple[int, Chunk]]:
        return self._async_events()

    async def _async_events(self) -> AsyncIterator[tuple[int, Chunk]]:
        loop = asyncio.get_running_loop()
        while True:
            waiter = None
            with self._lock:
                if self._events:
                    event = self._events.popleft()
                elif self.error is not None:
                    raise self.error
                elif self.done:
                    return
                else:
                    waiter = loop.create_future()
                    self._waiters.append((loop, waiter))
            if waiter is not None:
                await waiter
                continue
            yield event


def _resolve(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_result(None)
