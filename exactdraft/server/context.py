"""What every endpoint handler is given: the request and what the server's endpoints share,
and what the request came to (for its log line and the metrics).

Invariant: one Shared per application (its service, engine, served model name, metrics and
recent Responses API conversations), one Call per HTTP request. A call is finished exactly
once, when its outcome is known and before its last byte is sent (a whole response: when the
handler returns; a stream: before its final event, or when the client goes away): then it
writes one log line (logger `exactdraft.server`: method, path, status, prompt, cached,
completion, drafted and accepted tokens, milliseconds) and moves the metrics by exactly the
token counts the response reports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from exactdraft.decoding import Chunk, GenerationResult
from exactdraft.engine import Engine, Submission
from exactdraft.server.responses_store import ResponseStore
from exactdraft.server.service import Service

log = logging.getLogger("exactdraft.server")


@dataclass
class Shared:
    service: Service
    engine: Engine
    model_name: str
    on_shutdown: Callable[[], None] | None = None
    metrics: Any = None  # exactdraft.server.metrics.Metrics, when prometheus_client is there
    responses: ResponseStore = field(default_factory=ResponseStore)  # for previous_response_id


@dataclass
class Call:
    """One request on its way through an endpoint."""

    request: Any  # a starlette Request
    shared: Shared
    started: float = field(default_factory=time.perf_counter)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    first_token: float | None = None  # perf_counter() when the first token arrived
    quiet: bool = False  # log at DEBUG
    finished: bool = False

    @property
    def service(self) -> Service:
        return self.shared.service

    async def body(self) -> dict[str, Any]:
        from exactdraft.server.fields import parse_body

        return parse_body(await self.request.body())

    def seen(self, chunk: Chunk) -> None:
        """Note a chunk as it arrives (the first one with tokens sets the time to first
        token)."""
        if chunk.tokens and self.first_token is None:
            self.first_token = time.perf_counter()

    def count(self, prompt_tokens: int, results: Sequence[GenerationResult],
              cached_tokens: int = 0) -> None:
        """What the response reports: its prompt tokens and its results' tokens and drafts."""
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        for result in results:
            self.completion_tokens += len(result.tokens)
            self.drafted += result.stats.drafted
            self.accepted += result.stats.accepted

    def count_submission(self, submission: Submission, prompt_tokens: int) -> None:
        """count() of a submission's results so far (partial ones if it was cut short)."""
        results = [run.final or run.result("interrupted") for run in submission.runs]
        self.count(prompt_tokens, results, submission_cached(submission))

    def finish(self, status: int) -> None:
        if self.finished:
            return
        self.finished = True
        milliseconds = (time.perf_counter() - self.started) * 1000
        log.log(logging.DEBUG if self.quiet else logging.INFO,
                "%s %s %d prompt=%d cached=%d completion=%d drafted=%d accepted=%d ms=%.1f",
                self.request.method, self.request.url.path, status, self.prompt_tokens,
                self.cached_tokens, self.completion_tokens, self.drafted, self.accepted,
                milliseconds)
        if self.shared.metrics is not None:
            first = None if self.first_token is None else self.first_token - self.started
            self.shared.metrics.count(self.prompt_tokens, self.completion_tokens,
                                      self.cached_tokens, self.drafted, self.accepted, first)


def submission_cached(submission: Submission) -> int:
    """Prompt tokens of the submission's first sample taken from the prefix cache (what the
    response's usage reports)."""
    return submission.cached_tokens[0]
