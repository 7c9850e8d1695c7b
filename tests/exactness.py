"""End-to-end exactness checks that can fail: drafted and serial runs compared row by row.

Equal tokens are a weak witness. A kernel whose multi-row passes are off by an ulp leaves the
tokens of short runs on a tiny model unchanged: the drafted == serial loop of
tests/test_generator.py, run with the guard off on tests/inexact.py's InexactTorchBackend
(unpadded MKL matmuls and SDPA), gave 0 differing token sequences in 1200 runs. So an
ExactnessCheck compares, for every committed token after the first, the raw bytes of the logits
row that token was sampled from in the drafted run and in the serial run. On an invariant
backend they are the same bytes; on that inexact backend almost every run differs (1186 of the
same 1200). The first token of a run is sampled from the prefill, which drafting does not
touch, and is not recorded.

Rows are recorded by wrapping the generator's verifier for the length of one run: the wrapper
hands the verifier a sampler that keeps each row it samples from, keyed by absolute position.
If a committed position was sampled where the recorder cannot see it, the check fails instead
of comparing nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactdraft.guard import first_difference


class _RowKeepingSampler:
    """Delegates to a sampler and keeps the logits row behind every token it returns."""

    def __init__(self, sampler: Any, rows: dict[int, np.ndarray]) -> None:
        self._sampler = sampler
        self._rows = rows

    def sample(self, row: Any, params: Any, *, pos: int, **options: Any) -> int:
        token = self._sampler.sample(row, params, pos=pos, **options)
        self._rows[pos] = np.array(np.asarray(row), copy=True)
        return token

    def sample_window(self, rows: Any, params: Any, *, pos: int, **options: Any) -> list[int]:
        samples = self._sampler.sample_window(rows, params, pos=pos, **options)
        for j in range(len(samples)):
            self._rows[pos + j] = np.array(np.asarray(rows[j]), copy=True)
        return samples

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)


class RowRecorder:
    """A Verifier wrapping another one; `rows` maps a position to the row its token came from."""

    def __init__(self, verifier: Any) -> None:
        self.verifier = verifier
        self.rows: dict[int, np.ndarray] = {}

    def verify(self, rows: Any, drafts: Any, *, sampler: Any, **options: Any) -> Any:
        return self.verifier.verify(rows, drafts,
                                    sampler=_RowKeepingSampler(sampler, self.rows), **options)


@contextlib.contextmanager
def recording_rows(generator: Any) -> Iterator[dict[int, np.ndarray]]:
    """Record the rows of every run `generator` makes inside the block."""
    recorder = RowRecorder(generator.verifier)
    generator.verifier = recorder
    try:
        yield recorder.rows
    finally:
        generator.verifier = recorder.verifier


@dataclass
class ExactnessCheck:
    """Collects drafted-vs-serial comparisons; `assert_exact` fails on any difference, on a
    drafted run that did not draft, or when no draft was kept at all."""

    runs: int = 0
    drafted: int = 0
    accepted: int = 0
    token_mismatches: list[str] = field(default_factory=list)
    row_mismatches: list[str] = field(default_factory=list)
    drafting_off: list[str] = field(default_factory=list)
    flagged_runs: set[int] = field(default_factory=set)

    @staticmethod
    def serial_run(generator: Any, prompt: Any, max_new_tokens: int, params: Any,
                   **options: Any) -> tuple[Any, dict[int, np.ndarray]]:
        """A serial reference run and its rows, for `compare(reference=...)`."""
        with recording_rows(generator) as rows:
            result = generator.generate(prompt, max_new_tokens, params, drafts=False, **options)
        return result, rows

    def compare(self, generator: Any, prompt: Any, max_new_tokens: int, params: Any, *,
                serial: Any = None, reference: tuple[Any, dict] | None = None,
                label: str = "", **options: Any) -> tuple[Any, Any]:
        """Run `generator` with drafts and `serial` (default: the same generator) without, and
        compare; `reference` reuses a `serial_run` of the same case instead. Returns (drafted
        result, serial result)."""
        with recording_rows(generator) as drafted_rows:
            drafted = generator.generate(prompt, max_new_tokens, params, **options)
        if reference is None:
            reference = self.serial_run(generator if serial is None else serial, prompt,
                                        max_new_tokens, params, **options)
        self.add(drafted, drafted_rows, *reference, label)
        return drafted, reference[0]

    def add(self, drafted: Any, drafted_rows: dict[int, np.ndarray], serial: Any,
            serial_rows: dict[int, np.ndarray], label: str = "") -> None:
        """Compare one drafted result with its serial result, given both runs' rows."""
        run = self.runs
        self.runs += 1
        label = label or f"run {run}"
        if not drafted.stats.drafting:
            self.drafting_off.append(f"{label}: drafting was off ({drafted.stats.drafting_note})")
        assert serial.stats.drafted == 0, f"{label}: the serial reference drafted"
        self.drafted += drafted.stats.drafted
        self.accepted += drafted.stats.accepted
        if drafted.tokens != serial.tokens or drafted.finish_reason != serial.finish_reason:
            self.token_mismatches.append(
                f"{label}: drafted {drafted.tokens} ({drafted.finish_reason}) != serial "
                f"{serial.tokens} ({serial.finish_reason})")
            self.flagged_runs.add(run)
        first = len(serial.prompt_tokens)
        for offset in range(1, min(len(drafted.tokens), len(serial.tokens))):
            position = first + offset
            for rows, name in ((drafted_rows, "drafted"), (serial_rows, "serial")):
                assert position in rows, (
                    f"{label}: the {name} run's token at position {position} was sampled "
                    "outside the verifier, where the row recorder cannot see it")
            difference = first_difference(drafted_rows[position], serial_rows[position])
            if difference is not None:
                self.row_mismatches.append(
                    f"{label}: the logits row of output token {offset} (position {position}) "
                    f"has other bytes in the drafted run: {difference}")
                self.flagged_runs.add(run)
                break

    @property
    def flagged(self) -> int:
        """Runs with any token or row difference."""
        return len(self.flagged_runs)

    def summary(self) -> str:
        return (f"{self.runs} runs, {self.flagged} differing ({len(self.token_mismatches)} in "
                f"tokens, {len(self.row_mismatches)} in logits rows), {self.accepted} of "
                f"{self.drafted} drafts kept")

    def assert_exact(self, *, min_accepted: int = 1, some_rejected: bool = False) -> None:
        problems = self.drafting_off + self.token_mismatches + self.row_mismatches
        assert not problems, self.summary() + ":\n" + "\n".join(problems[:10])
        assert self.runs > 0, "nothing was compared"
        assert self.accepted >= min_accepted, (
            f"{self.summary()}: too few drafts kept for multi-row passes to have been compared")
        if some_rejected:
            assert self.accepted < self.drafted, f"{self.summary()}: no draft was rejected"

    def assert_caught(self, min_fraction: float = 0.5) -> None:
        """For negative controls: drafting ran, drafts were kept, and at least `min_fraction`
        of the runs differ from their serial runs."""
        assert not self.drafting_off, self.drafting_off[:3]
        assert self.accepted > 0, f"{self.summary()}: no multi-row pass was compared"
        assert self.flagged >= max(1, min_fraction * self.runs), (
            f"{self.summary()}: the check did not catch the inexact backend")


class OracleDrafter:
    """Proposes a known continuation with some tokens deliberately wrong, so verification sees
    long accepted runs, mismatches at every depth, and bonus tokens."""

    def __init__(self, continuation: list[int], max_draft: int, error_rate: float, seed: int):
        self.continuation = continuation
        self.max_draft = max_draft
        self.error_rate = error_rate
        self.rng = np.random.default_rng(seed)
        self.n_prompt = 0

    def begin(self, prompt, context):
        self.n_prompt = len(prompt)

    def propose(self, sequence, limit):
        done = len(sequence) - self.n_prompt
        guess = list(self.continuation[done:done + limit])
        for i in range(len(guess)):
            if self.rng.random() < self.error_rate:
                guess[i] = int(self.rng.integers(0, 128))
        return guess

    def accepted(self, proposed, accepted):
        pass
