"""Helpers for users' own test suites: pin sampling reproducibility and drafted exactness.

Invariant: a recording holds everything needed to replay a generation (prompt ids, sampling
parameters including the seed, max_new_tokens, stop settings) and to tell whether a replay can
be expected to match (a fingerprint of the model's weights and the backend); a recording file is
written whole or not at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from exactdraft.check import check_exactness
from exactdraft.generator import GenerationResult, Generator
from exactdraft.prompts import PromptInput
from exactdraft.sampling import SamplingParams

FORMAT = "exactdraft-recording/1"


def assert_drafted_equals_serial(generator: Generator, prompts: Sequence[PromptInput],
                                 seeds: Sequence[int] = (0, 1, 2),
                                 sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                                 max_new_tokens: int = 64) -> None:
    """Fail with a readable message unless every drafted run equals its serial run."""
    settings = [sampling] if isinstance(sampling, SamplingParams) else \
        list(sampling or [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8)])
    report = check_exactness(generator, prompts, seeds, settings, max_new_tokens)
    if report.drafting_note is not None:
        raise AssertionError(f"the load-time guard turned drafting off: {report.drafting_note}")
    if not report.passed:
        raise AssertionError("drafted output differs from serial output:\n" + report.failures())


def model_fingerprint(generator: Generator) -> str:
    """sha256 of the weights as loaded and the arithmetic contract they run under: equal
    fingerprints mean the same weights on the same arithmetic, on any machine."""
    target = generator.target
    identity = f"{target.weights_digest()}\n{target.arithmetic}\n{target.vocab_size}"
    return hashlib.sha256(identity.encode()).hexdigest()


def _params_dict(params: SamplingParams) -> dict[str, Any]:
    values = dataclasses.asdict(params)
    values["logit_bias"] = {str(k): v for k, v in params.logit_bias.items()}
    return values


def _params_from(values: dict[str, Any]) -> SamplingParams:
    values = dict(values)
    values["logit_bias"] = {int(k): v for k, v in values.get("logit_bias", {}).items()}
    return SamplingParams(**values)


def write_json_atomically(path: str, payload: dict[str, Any]) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".exactdraft-", suffix=".json")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(payload, stream, indent=1)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def record_generation(generator: Generator, path: str, prompt: PromptInput,
                      max_new_tokens: int = 64, sampling: SamplingParams | None = None,
                      stop: str | Sequence[str] = ()) -> GenerationResult:
    """Generate (serially) and write what is needed to check a later run to a JSON file."""
    result = generator.generate(prompt, max_new_tokens, sampling, stop=stop, drafts=False)
    params = (sampling or SamplingParams()).with_seed(result.seed)
    write_json_atomically(path, {
        "format": FORMAT,
        "prompt_tokens": result.prompt_tokens,
        "max_new_tokens": max_new_tokens,
        "sampling": _params_dict(params),
        "stop": [stop] if isinstance(stop, str) else list(stop),
        "tokens": result.tokens,
        "finish_reason": result.finish_reason,
        "fingerprint": model_fingerprint(generator),
    })
    return result


def assert_reproduces(generator: Generator, path: str, drafts: bool = True) -> GenerationResult:
    """Replay a recording (drafted by default) and fail with a readable message on any
    difference from the recorded tokens."""
    with open(path) as stream:
        recording = json.load(stream)
    if recording.get("format") != FORMAT:
        raise ValueError(f"{path}: not an exactdraft recording "
                         f"(format {recording.get('format')!r})")
    fingerprint = model_fingerprint(generator)
    if fingerprint != recording["fingerprint"]:
        raise AssertionError(f"{path}: recorded with another model or backend (fingerprint "
                             f"{recording['fingerprint'][:12]}, this one {fingerprint[:12]})")
    result = generator.generate(recording["prompt_tokens"], recording["max_new_tokens"],
                                _params_from(recording["sampling"]), stop=recording["stop"],
                                drafts=drafts)
    expected = recording["tokens"]
    if result.tokens != expected or result.finish_reason != recording["finish_reason"]:
        index = next((i for i, (a, b) in enumerate(zip(result.tokens, expected)) if a != b),
                     min(len(result.tokens), len(expected)))
        got = result.tokens[index] if index < len(result.tokens) else None
        want = expected[index] if index < len(expected) else None
        raise AssertionError(
            f"{path}: replay differs at output token {index}: got {got}, recorded {want} "
            f"({len(result.tokens)} tokens, {result.finish_reason!r} vs recorded "
            f"{len(expected)}, {recording['finish_reason']!r})")
    return result
