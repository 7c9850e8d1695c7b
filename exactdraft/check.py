"""The exactness harness: drafted against serial, case by case, with the first divergence.

Invariant: a case counts as identical only when the drafted and serial runs committed the very
same token ids and finished for the same reason; nothing is averaged or tolerated. When a case
differs, the report names the first divergent position, both tokens, and how far apart the two
runs' logits rows for that position were, read back from the passes that actually produced them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactdraft.errors import ParameterError
from exactdraft.generator import GenerationResult, Generator
from exactdraft.progress import Progress
from exactdraft.prompts import PromptInput
from exactdraft.sampling.params import SamplingParams


@dataclass
class Divergence:
    index: int  # position in the generated output
    drafted_token: int | None  # None: the run had already stopped
    serial_token: int | None
    logits_max_difference: float | None


@dataclass
class Case:
    prompt_index: int
    seed: int
    setting: str
    drafted: GenerationResult
    serial: GenerationResult
    divergence: Divergence | None = None

    @property
    def identical(self) -> bool:
        return self.divergence is None

    def line(self) -> str:
        """One line: the case, and identical (with tokens and acceptance) or where it differs."""
        stats = self.drafted.stats
        where = f"prompt {self.prompt_index}, seed {self.seed}, {self.setting}"
        if self.divergence is not None:
            return f"{where}: DIFFERS from output token {self.divergence.index}"
        acceptance = stats.accepted / stats.drafted if stats.drafted else 0.0
        return (f"{where}: identical, {len(self.drafted.tokens)} tokens, acceptance "
                f"{acceptance:.0%}")


@dataclass
class CheckReport:
    cases: list[Case] = field(default_factory=list)
    drafting_note: str | None = None  # the load-time guard's finding, if it found a problem

    @property
    def passed(self) -> bool:
        return all(case.identical for case in self.cases)

    def rows(self) -> list[dict[str, Any]]:
        """One summary row per setting: cases, identical, tokens compared, acceptance, speed-up."""
        summary = []
        for setting in dict.fromkeys(case.setting for case in self.cases):
            cases = [c for c in self.cases if c.setting == setting]
            drafted = sum(c.drafted.stats.drafted for c in cases)
            accepted = sum(c.drafted.stats.accepted for c in cases)
            serial_time = sum(c.serial.stats.decode_seconds for c in cases)
            drafted_time = sum(c.drafted.stats.decode_seconds for c in cases)
            summary.append({
                "setting": setting,
                "cases": len(cases),
                "identical": sum(c.identical for c in cases),
                "tokens": sum(min(len(c.drafted.tokens), len(c.serial.tokens)) for c in cases),
                "acceptance": accepted / drafted if drafted else 0.0,
                "speedup": serial_time / drafted_time if drafted_time > 0 else 0.0,
            })
        return summary

    def table(self) -> str:
        lines = [f"{'setting':<34} {'cases':>5} {'identical':>9} {'tokens':>7} "
                 f"{'accept':>7} {'speed-up':>8}"]
        for row in self.rows():
            lines.append(f"{row['setting']:<34} {row['cases']:>5} {row['identical']:>9} "
                         f"{row['tokens']:>7} {row['acceptance']:>7.1%} {row['speedup']:>7.2f}x")
        return "\n".join(lines)

    def failures(self) -> str:
        lines = []
        for case in self.cases:
            d = case.divergence
            if d is None:
                continue
            gap = "n/a" if d.logits_max_difference is None else f"{d.logits_max_difference:.3g}"
            lines.append(f"prompt {case.prompt_index}, seed {case.seed}, {case.setting}: first "
                         f"difference at output token {d.index}: drafted {d.drafted_token}, "
                         f"serial {d.serial_token}; logits rows differ by at most {gap}")
        return "\n".join(lines)


def describe(params: SamplingParams) -> str:
    parts = [f"t={params.temperature:g}"]
    for name, default in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0),
                          ("repetition_penalty", 1.0), ("presence_penalty", 0.0),
                          ("frequency_penalty", 0.0)):
        value = getattr(params, name)
        if value != default:
            parts.append(f"{name}={value:g}")
    return " ".join(parts)


class _RecordingTarget:
    """Wraps a target and keeps the logits row each forward produced for every position."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.vocab_size = target.vocab_size
        self.max_context = target.max_context
        self.rows: dict[int, np.ndarray] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)

    def new_state(self) -> Any:
        return self.target.new_state()

    def truncate(self, state: Any, length: int) -> None:
        self.target.truncate(state, length)

    def forward(self, state: Any, tokens: Sequence[int], rows: str = "last") -> np.ndarray:
        start = state.length
        out = self.target.forward(state, tokens, rows=rows)
        first = start + len(tokens) - len(out)
        for offset, row in enumerate(out):
            self.rows[first + offset] = row.copy()
        return out


def first_divergence(drafted: list[int], serial: list[int]) -> int | None:
    for index in range(max(len(drafted), len(serial))):
        a = drafted[index] if index < len(drafted) else None
        b = serial[index] if index < len(serial) else None
        if a != b:
            return index
    return None


def _logits_gap(generator: Generator, prompt: PromptInput, max_new_tokens: int,
                params: SamplingParams, stop: Any, position: int) -> float | None:
    """Re-run both modes recording rows and compare the rows that predicted `position`."""
    rows = []
    for drafts in (True, False):
        recorder = _RecordingTarget(generator.target)
        probe = Generator(recorder, generator.drafter, generator.verifier, generator.sampler,
                          generator.tokenizer, guard=False, adaptive_depth=False,
                          sampling=generator.sampling,
                          stop_tokens=generator.stop_tokens, progress=False)
        probe.generate(prompt, max_new_tokens, params, stop=stop, drafts=drafts)
        rows.append(recorder.rows.get(position - 1))
    if rows[0] is None or rows[1] is None:
        return None
    return float(np.abs(rows[0].astype(np.float64) - rows[1]).max())


def check_exactness(generator: Generator, prompts: Sequence[PromptInput],
                    seeds: Sequence[int], settings: Sequence[SamplingParams],
                    max_new_tokens: int = 64, stop: str | Sequence[str] = (), *,
                    progress: bool | None = None,
                    on_case: Callable[[Case, int, int], None] | None = None) -> CheckReport:
    """Generate every prompt x seed x setting with drafts and without, and compare.
    `progress` shows the case being run (None: in a notebook, or on stderr when it is a
    terminal); `on_case(case, done, total)` is called as each case is decided."""
    if generator.drafter is None:
        raise ParameterError("check_exactness needs a Generator with a drafter")
    report = CheckReport(drafting_note=generator.drafting_note)
    if generator.drafting_note is not None:
        # Measure what drafting would do anyway: the point of a check is to see it. At full
        # depth: adaptive depth may judge a slow backend's passes too dear to draft at all.
        generator = Generator(generator.target, generator.drafter, generator.verifier,
                              generator.sampler, generator.tokenizer, guard=False,
                              adaptive_depth=False, sampling=generator.sampling,
                              stop_tokens=generator.stop_tokens, progress=progress)
    total = len(prompts) * len(seeds) * len(settings)
    with Progress("check", progress) as shown:
        for prompt_index, prompt in enumerate(prompts):
            for seed in seeds:
                for setting in settings:
                    shown.count(len(report.cases), total,
                                f"cases done, now prompt {prompt_index}, seed {seed}, "
                                f"{describe(setting)}")
                    report.cases.append(_case(generator, prompt_index, prompt, seed, setting,
                                              max_new_tokens, stop))
                    if on_case is not None:
                        on_case(report.cases[-1], len(report.cases), total)
        shown.count(total, total, "cases done")
    return report


def _case(generator: Generator, prompt_index: int, prompt: PromptInput, seed: int,
          setting: SamplingParams, max_new_tokens: int, stop: str | Sequence[str]) -> Case:
    """One prompt x seed x setting, drafted and serial, with its first divergence if any."""
    params = setting.with_seed(seed)
    drafted = generator.generate(prompt, max_new_tokens, params, stop=stop)
    serial = generator.generate(prompt, max_new_tokens, params, stop=stop, drafts=False)
    case = Case(prompt_index, seed, describe(params), drafted, serial)
    index = first_divergence(drafted.tokens, serial.tokens)
    if index is None and drafted.finish_reason != serial.finish_reason:
        index = min(len(drafted.tokens), len(serial.tokens))
    if index is not None:
        at = len(serial.prompt_tokens) + index
        case.divergence = Divergence(
            index,
            drafted.tokens[index] if index < len(drafted.tokens) else None,
            serial.tokens[index] if index < len(serial.tokens) else None,
            _logits_gap(generator, prompt, max_new_tokens, params, stop, at))
    return case
