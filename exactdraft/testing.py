"""Helpers for users' own test suites: pin sampling reproducibility and drafted exactness.

Invariant: a recording holds everything needed to replay a generation (prompt ids, sampling
parameters including the seed, max_new_tokens, stop settings), what it produced (token ids and
their text), and what a replay must share to be expected to match: the weights and the
arithmetic contract they ran under, never this machine's raw bits, so a recording made on one
CPU replays on any other under the same contract. A recording file is written whole or not at
all, and is rewritten only when asked (update=True, or pytest --exactdraft-update with this
module loaded as a plugin: `pytest -p exactdraft.testing` or `pytest_plugins =
["exactdraft.testing"]` in a conftest.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from exactdraft.check import check_exactness, first_divergence
from exactdraft.errors import ParameterError, RecordingError
from exactdraft.generator import GenerationResult, Generator
from exactdraft.progress import Progress
from exactdraft.prompts import PromptInput
from exactdraft.sampling.params import SAMPLING_FIELDS, SamplingParams, sampling_from

FORMAT = "exactdraft-recording/2"
READABLE_FORMATS = ("exactdraft-recording/1", FORMAT)
UPDATE_OPTION = "--exactdraft-update"
_update_from_pytest = False  # set by the pytest plugin hooks below


def assert_drafted_equals_serial(generator: Generator, prompts: Sequence[PromptInput],
                                 seeds: Sequence[int] = (0, 1, 2),
                                 sampling: SamplingParams | Sequence[SamplingParams] | None = None,
                                 max_new_tokens: int = 64, *,
                                 progress: bool | None = None) -> None:
    """Fail with a readable message unless every drafted run equals its serial run."""
    if generator.drafting_note is not None:  # nothing drafted would be compared
        raise AssertionError(f"the load-time guard turned drafting off: "
                             f"{generator.drafting_note}")
    settings = [sampling] if isinstance(sampling, SamplingParams) else \
        list(sampling or [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8)])
    report = check_exactness(generator, prompts, seeds, settings, max_new_tokens,
                             progress=progress)
    if not report.passed:
        raise AssertionError("drafted output differs from serial output:\n" + report.failures())


def model_fingerprint(generator: Generator) -> str:
    """sha256 of the weights as loaded and the arithmetic contract they run under: equal
    fingerprints mean the same weights on the same arithmetic, on any machine."""
    target = generator.target
    identity = f"{target.weights_digest()}\n{target.arithmetic}\n{target.vocab_size}"
    return hashlib.sha256(identity.encode()).hexdigest()


def _params_dict(params: SamplingParams) -> dict[str, Any]:
    values = {name: getattr(params, name) for name in SAMPLING_FIELDS}  # the draw's fields only
    values["logit_bias"] = {str(k): v for k, v in params.logit_bias.items()}
    return values


def write_json_atomically(path: str, payload: dict[str, Any]) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".exactdraft-", suffix=".json")
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(payload, stream, indent=1)
            stream.write("\n")
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _run(generator: Generator, label: str, progress: bool | None, prompt: PromptInput,
         max_new_tokens: int, params: SamplingParams, stop: str | Sequence[str],
         stop_tokens: Sequence[int] | None, drafts: bool) -> GenerationResult:
    stream = generator.stream(prompt, max_new_tokens, params, stop=stop,
                              stop_tokens=stop_tokens, drafts=drafts)
    done = 0
    with Progress(label, progress) as shown:
        for chunk in stream:
            done += len(chunk.tokens)
            shown.count(done, max_new_tokens, "tokens")
    return stream.result


def record_generation(generator: Generator, path: str, prompt: PromptInput,
                      max_new_tokens: int = 64,
                      sampling: SamplingParams | Mapping[str, Any] | None = None,
                      stop: str | Sequence[str] = (), *,
                      progress: bool | None = None) -> GenerationResult:
    """Generate (serially) and write what is needed to check a later run to a JSON file,
    replacing any file there. `sampling` fields not given keep the generator's default."""
    params = sampling_from(sampling, generator.sampling, where="record_generation").with_seed()
    stop_tokens = list(generator.stop_tokens)
    result = _run(generator, f"recording {os.path.basename(path)}", progress, prompt,
                  max_new_tokens, params, stop, stop_tokens, drafts=False)
    write_json_atomically(path, {
        "format": FORMAT,
        "prompt_tokens": result.prompt_tokens,
        "max_new_tokens": max_new_tokens,
        "sampling": _params_dict(params),
        "stop": [stop] if isinstance(stop, str) else list(stop),
        "stop_tokens": stop_tokens,
        "tokens": result.tokens,
        "text": result.text,
        "finish_reason": result.finish_reason,
        "weights": generator.target.weights_digest(),
        "arithmetic": generator.target.arithmetic,
        "fingerprint": model_fingerprint(generator),
    })
    return result


def read_recording(path: str) -> dict[str, Any]:
    """A recording's fields, each checked; a RecordingError names the file and the problem."""
    try:
        with open(path, encoding="utf-8") as stream:
            recording = json.load(stream)
    except FileNotFoundError:
        raise RecordingError(
            f"{path}: no such recording. Create it once with exactdraft.testing."
            f"record_generation(generator, {path!r}, prompt, max_new_tokens=..., sampling=...), "
            f"or pass prompt=... to assert_reproduces and run it with update=True (in pytest: "
            f"-p exactdraft.testing {UPDATE_OPTION}); then commit the file") from None
    except json.JSONDecodeError as error:
        raise RecordingError(f"{path}: not valid JSON ({error.msg}: line {error.lineno}, "
                             f"column {error.colno}); a truncated file? Recreate it with "
                             "record_generation, or assert_reproduces(..., prompt=..., "
                             "update=True)") from None
    except UnicodeDecodeError as error:
        raise RecordingError(f"{path}: not UTF-8 text ({error.reason} at byte "
                             f"{error.start})") from None
    except OSError as error:
        raise RecordingError(f"{path}: cannot be read ({error.strerror or error})") from None
    if not isinstance(recording, dict):
        raise RecordingError(f"{path}: holds a JSON {type(recording).__name__}, not a recording "
                             "(a JSON object written by exactdraft.testing.record_generation)")
    if recording.get("format") not in READABLE_FORMATS:
        raise RecordingError(f"{path}: not an exactdraft recording (format "
                             f"{recording.get('format')!r}; expected {FORMAT!r})")

    def field(name: str, kind: type | tuple[type, ...], what: str, required: bool = True) -> Any:
        if name not in recording:
            if not required:
                return None
            raise RecordingError(f"{path}: has no {name!r} field; recreate it with "
                                 "record_generation, or assert_reproduces(..., prompt=..., "
                                 "update=True)")
        value = recording[name]
        if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
            raise RecordingError(f"{path}: {name!r} must be {what}, got {value!r:.80}")
        return value

    def token_ids(name: str, required: bool = True) -> list[int] | None:
        value = field(name, list, "a list of token ids", required)
        if value is not None and any(isinstance(t, bool) or not isinstance(t, int) or t < 0
                                     for t in value):
            raise RecordingError(f"{path}: {name!r} must be a list of token ids >= 0")
        return value

    checked = {
        "prompt_tokens": token_ids("prompt_tokens"),
        "tokens": token_ids("tokens"),
        "stop_tokens": token_ids("stop_tokens", required=False),
        "max_new_tokens": field("max_new_tokens", int, "an integer"),
        "finish_reason": field("finish_reason", str, "a string"),
        "fingerprint": field("fingerprint", str, "a hex digest"),
        "text": field("text", (str, type(None)), "a string or null", required=False),
        "weights": field("weights", str, "a hex digest", required=False),
        "arithmetic": field("arithmetic", str, "a string", required=False),
    }
    stop = field("stop", list, "a list of stop strings")
    if not all(isinstance(s, str) for s in stop):
        raise RecordingError(f"{path}: 'stop' must be a list of stop strings, got {stop!r:.80}")
    checked["stop"] = stop
    values = dict(field("sampling", dict, "an object of SamplingParams fields"))
    try:
        bias = values.get("logit_bias") or {}
        values["logit_bias"] = {int(k): v for k, v in bias.items()}
        checked["sampling"] = SamplingParams(**values)
    except (ParameterError, TypeError, ValueError, AttributeError) as error:
        raise RecordingError(f"{path}: 'sampling' cannot be used: {error}") from None
    return checked


def _request_differs(recording: dict[str, Any], generator: Generator, prompt: PromptInput,
                     max_new_tokens: int, sampling: Any, stop: str | Sequence[str]) -> str | None:
    from exactdraft.prompts import encode_prompt

    ids = encode_prompt(prompt, generator.tokenizer, generator.target.vocab_size)
    params = sampling_from(sampling, generator.sampling, where="assert_reproduces")
    recorded = recording["sampling"]
    if params.seed is None:
        recorded = dataclasses.replace(recorded, seed=None)
    stops = [stop] if isinstance(stop, str) else list(stop)
    for name, now, then in (("prompt", ids, recording["prompt_tokens"]),
                            ("max_new_tokens", max_new_tokens, recording["max_new_tokens"]),
                            ("sampling", params, recorded), ("stop", stops, recording["stop"])):
        if now != then:
            return name
    return None


def _update_requested(update: bool | None) -> bool:
    if update is None:
        return _update_from_pytest
    if not isinstance(update, bool):
        raise ParameterError(f"update must be True, False or None, got {update!r}")
    return update


def assert_reproduces(generator: Generator, path: str, drafts: bool = True, *,
                      prompt: PromptInput | None = None, max_new_tokens: int = 64,
                      sampling: SamplingParams | Mapping[str, Any] | None = None,
                      stop: str | Sequence[str] = (), update: bool | None = None,
                      progress: bool | None = None) -> GenerationResult:
    """Replay a recording (drafted by default) and fail with a readable message on any
    difference from the recorded tokens or text.

    `update=True` rewrites the recording on purpose instead (from `prompt` and the settings
    when given, else from the recorded request) and then checks the replay against it;
    `update=None` follows pytest's --exactdraft-update option when this module is loaded as a
    plugin. `prompt` (with max_new_tokens, sampling, stop) also lets a missing recording be
    created by an update run, and is checked against the recorded request."""
    if _update_requested(update):
        if prompt is None:
            recording = read_recording(path)
            prompt, max_new_tokens = recording["prompt_tokens"], recording["max_new_tokens"]
            sampling, stop = recording["sampling"], recording["stop"]
        record_generation(generator, path, prompt, max_new_tokens, sampling, stop,
                          progress=progress)
    recording = read_recording(path)
    mismatch = _contract_mismatch(path, recording, generator)
    if mismatch is not None:
        raise AssertionError(mismatch)
    if prompt is not None:
        changed = _request_differs(recording, generator, prompt, max_new_tokens, sampling, stop)
        if changed is not None:
            raise AssertionError(f"{path}: recorded for another request (its {changed} "
                                 f"differs); rewrite it with update=True or {UPDATE_OPTION}")
    result = _run(generator, f"replaying {os.path.basename(path)}", progress,
                  recording["prompt_tokens"], recording["max_new_tokens"],
                  recording["sampling"], recording["stop"], recording["stop_tokens"], drafts)
    expected = recording["tokens"]
    index = first_divergence(result.tokens, expected)
    same_end = result.finish_reason == recording["finish_reason"]
    text_differs = recording["text"] is not None and result.text is not None and \
        result.text != recording["text"]
    if index is not None or not same_end or text_differs:
        raise AssertionError(_describe_difference(path, recording, result, index,
                                                  generator.tokenizer))
    return result


def _contract_mismatch(path: str, recording: dict[str, Any], generator: Generator) -> str | None:
    """Why the recording cannot be expected to replay on this generator, or None."""
    target = generator.target
    fix = f"if the change is on purpose, rewrite it with update=True (pytest: {UPDATE_OPTION})"
    fingerprint = model_fingerprint(generator)
    weights, arithmetic = recording["weights"], recording["arithmetic"]
    if weights is not None and weights != target.weights_digest():
        return (f"{path}: recorded with another model or backend: other weights (digest "
                f"{weights[:12]} there, {target.weights_digest()[:12]} here); {fix}")
    if arithmetic is not None and arithmetic != target.arithmetic:
        return (f"{path}: recorded under another arithmetic contract ({arithmetic!r} there, "
                f"{target.arithmetic!r} here). Tokens replay exactly within one contract (the "
                "CPU kernels' on any CPU, SIMD level and thread count), not across contracts: "
                f"keep one recording per contract, or {fix}")
    if recording["fingerprint"] != fingerprint:
        return (f"{path}: recorded with another model or backend (fingerprint "
                f"{recording['fingerprint'][:12]}, this one {fingerprint[:12]}); {fix}")
    return None


def _piece(tokens: list[int], index: int, tokenizer: Any) -> str:
    if index >= len(tokens):
        return "nothing (the run had ended)"
    if tokenizer is None:
        return f"token {tokens[index]}"
    return f"token {tokens[index]} {_decoded([tokens[index]], tokenizer)!r}"


def _decoded(tokens: list[int], tokenizer: Any) -> str:
    try:
        return tokenizer.decode(tokens)
    except Exception as error:  # noqa: BLE001 - a diagnostic must not hide the difference
        return f"<cannot decode: {error}>"


def _around(tokens: list[int], index: int, tokenizer: Any) -> str:
    """The tokens before `index` | from `index` on, as text when there is a tokenizer."""
    before, after = tokens[max(0, index - 8):index], tokens[index:index + 8]
    lead = "..." if index > 8 else ""
    tail = "..." if index + 8 < len(tokens) else ""
    if tokenizer is None:
        return f"{lead}{before} | {after}{tail}"
    return f"{lead}{_decoded(before, tokenizer)!r} | {_decoded(after, tokenizer)!r}{tail}"


def _describe_difference(path: str, recording: dict[str, Any], result: GenerationResult,
                         index: int | None, tokenizer: Any) -> str:
    expected, got = recording["tokens"], result.tokens
    if index is not None:
        lines = [f"{path}: replay differs at output token {index}: recorded "
                 f"{_piece(expected, index, tokenizer)}, replayed {_piece(got, index, tokenizer)}",
                 f"  recorded: {_around(expected, index, tokenizer)}",
                 f"  replayed: {_around(got, index, tokenizer)}"]
    elif result.finish_reason != recording["finish_reason"]:
        lines = [f"{path}: the replay has the recorded tokens but another finish"]
    else:
        lines = [f"{path}: the replay has the recorded tokens but another text (did the "
                 f"tokenizer change?): recorded {recording['text']!r:.200}, replayed "
                 f"{result.text!r:.200}"]
    lines.append(f"  recorded {len(expected)} tokens, finish {recording['finish_reason']!r}; "
                 f"replayed {len(got)} tokens, finish {result.finish_reason!r}")
    return "\n".join(lines)


# -- pytest plugin: `pytest -p exactdraft.testing --exactdraft-update` -------------------------

def pytest_addoption(parser: Any) -> None:
    parser.addoption(UPDATE_OPTION, action="store_true", default=False,
                     help="rewrite exactdraft recordings (assert_reproduces) from this run "
                          "instead of checking them")


def pytest_configure(config: Any) -> None:
    global _update_from_pytest
    _update_from_pytest = bool(config.getoption(UPDATE_OPTION, default=False))


def pytest_unconfigure(config: Any) -> None:
    global _update_from_pytest
    _update_from_pytest = False
