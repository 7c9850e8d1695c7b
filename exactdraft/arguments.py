"""Checks of the arguments that build a Generator, made before anything loads or runs.

Invariant: a wrong argument (a drafter passed where the backend goes, a path passed as a model,
a flag that is not a boolean) is refused with a ParameterError that names the argument and the
value it got, before any checkpoint is read or any model pass runs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from exactdraft.errors import ParameterError


def check_component(name: str, value: Any, needs: tuple[str, ...], what: str) -> None:
    if value is None and name != "target":
        return
    missing = [attribute for attribute in needs if not hasattr(value, attribute)]
    if missing:
        raise ParameterError(f"{name} must be {what}; got {type(value).__name__} "
                             f"{_short(value)}, which has no {', '.join(missing)}")


def is_drafter_factory(drafter: Any) -> bool:
    """Whether `drafter` is a function of the target that makes the drafter (a drafter built on
    the target, such as DraftHead, given to from_pretrained before the target exists)."""
    return callable(drafter) and not hasattr(drafter, "propose") and \
        not hasattr(drafter, "forward")


def check_drafter(drafter: Any) -> None:
    if drafter is None:
        return
    hint = ("a Drafter such as PromptLookup() or DraftModel(smaller_model)"
            if not hasattr(drafter, "forward") else
            "a Drafter; to draft with a smaller model, wrap it: DraftModel(model)")
    check_component("drafter", drafter, ("max_draft", "begin", "propose", "accepted"), hint)
    depth = drafter.max_draft
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ParameterError(f"drafter.max_draft must be an integer >= 1, got {depth!r}")


def check_flags(**values: Any) -> None:
    """strict, guard, adaptive_depth: booleans; progress: a boolean or None; prefill_chunk: an
    integer >= 1."""
    for name, value in values.items():
        if name == "prefill_chunk":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParameterError(f"prefill_chunk must be an integer >= 1, got {value!r}")
        elif not isinstance(value, bool) and not (name == "progress" and value is None):
            allowed = "True, False or None" if name == "progress" else "True or False"
            raise ParameterError(f"{name} must be {allowed}, got {_short(value)}")


def check_pretrained_arguments(path_or_id: Any, backend: Any, drafter: Any, device: Any,
                                dtype: Any, max_context: Any) -> None:
    if hasattr(path_or_id, "propose"):
        raise ParameterError(f"from_pretrained got a drafter ({_short(path_or_id)}) as the "
                             "model; pass the model's path first and the drafter as drafter=...")
    if path_or_id is not None and not isinstance(path_or_id, (str, os.PathLike)):
        raise ParameterError(f"from_pretrained: the model must be a path or a hub id, got "
                             f"{type(path_or_id).__name__} {_short(path_or_id)}")
    if hasattr(backend, "propose"):
        raise ParameterError(f"from_pretrained got a drafter ({_short(backend)}) as `backend`; "
                             "pass it as drafter=...")
    if not isinstance(backend, str) and not all(hasattr(backend, a) for a in ("matrix",
                                                                               "linear")):
        raise ParameterError(f"backend must be a name ('auto', 'torch', 'torch-padded', 'mlx' "
                             f"or a registered one) or a backend object, got "
                             f"{type(backend).__name__} {_short(backend)}")
    if not is_drafter_factory(drafter):
        check_drafter(drafter)
    for name, value in (("device", device), ("dtype", dtype)):
        if value is not None and not isinstance(value, str):
            raise ParameterError(f"{name} must be a str or None, got {_short(value)}")
    if max_context is not None and (isinstance(max_context, bool) or
                                    not isinstance(max_context, int) or max_context < 2):
        raise ParameterError(f"max_context must be an integer >= 2 or None, got "
                             f"{_short(max_context)}")


def stops_with_config(tokenizer: Any, target: Any, config: Mapping[str, Any],
                       source: str) -> list[int]:
    """The default stop tokens plus generation_config.json's eos_token_id (an id or a list)."""
    stops = list(getattr(tokenizer, "stop_token_ids", None) or target.eos_token_ids)
    extra = config.get("eos_token_id")
    for token in extra if isinstance(extra, list) else [] if extra is None else [extra]:
        if isinstance(token, bool) or not isinstance(token, int) or \
                not 0 <= token < target.vocab_size:
            warnings.warn(f"{source}: ignoring eos_token_id {token!r}, not a token id of this "
                          f"model's vocabulary [0, {target.vocab_size})", RuntimeWarning,
                          stacklevel=3)
        elif token not in stops:
            stops.append(token)
    return stops


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- the keywords of generate, stream and prepare --------------------------------------------

# Their own keywords besides the prompt and the sampling fields (temperature, top_k, ...). A new
# keyword is one entry here (and its use in Generator.prepare); the check below reads this.
REQUEST_KEYWORDS = ("max_new_tokens", "max_tokens", "sampling", "stop", "stop_tokens", "drafts",
                    "logprobs", "constraint", "n")
# The names transformers, vLLM, llama-cpp-python and mlx-lm give the same settings.
ALIASES = {
    "sampling_params": "sampling",  # vLLM: llm.generate(prompts, sampling_params=...)
    "num_return_sequences": "n",  # transformers
    "stop_strings": "stop",  # transformers
    "stop_token_ids": "stop_tokens",  # vLLM
    "eos_token_id": "stop_tokens",  # transformers (an id or a list of ids)
    "repeat_penalty": "repetition_penalty",  # llama-cpp-python
    "temp": "temperature",  # mlx-lm, llama.cpp
}
DO_SAMPLE = "do_sample"  # transformers: False is greedy (temperature 0)


def request_options(options: Mapping[str, Any], sampling_fields: Sequence[str], where: str,
                    sampling_given: bool = False) -> dict[str, Any]:
    """`options` in exactdraft's own names: each alias renamed, `do_sample=False` turned into
    temperature 0 (`do_sample=True` is kept for the caller to check against the temperature it
    resolves). An unknown name, or one setting given under two names, raises ParameterError
    naming it and the valid names. Applying it twice gives the same result."""
    valid = REQUEST_KEYWORDS + tuple(sampling_fields)
    own: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for name, value in options.items():
        if name == DO_SAMPLE:
            continue
        canonical = ALIASES.get(name, name)
        if canonical not in valid:
            aliases = ", ".join(f"{alias} ({canonical})" for alias, canonical in ALIASES.items())
            raise ParameterError(
                f"{where}() got an unknown keyword {name!r}; valid keywords: "
                f"{', '.join(valid)}; also understood: {DO_SAMPLE}, {aliases}")
        if canonical in own:
            raise ParameterError(f"{where}() got both {spelled[canonical]}= and {name}= (the "
                                 "same setting); pass one")
        if name == "eos_token_id" and isinstance(value, int) and not isinstance(value, bool):
            value = [value]  # transformers takes one id or a list
        own[canonical], spelled[canonical] = value, name
    if sampling_given and "sampling" in own:
        raise ParameterError(f"{where}() got both sampling= and {spelled['sampling']}=; pass "
                             "one")
    if DO_SAMPLE in options:
        do_sample = options[DO_SAMPLE]
        if not isinstance(do_sample, bool):
            raise ParameterError(f"do_sample must be True or False, got {_short(do_sample)}")
        temperature = own.get("temperature")
        if do_sample is False:
            if temperature is not None and temperature != 0:
                raise ParameterError(f"{where}() got do_sample=False (greedy) and temperature="
                                     f"{temperature!r}; pass one")
            if sampling_given or own.get("sampling") is not None:
                raise ParameterError(f"{where}() got both sampling= and do_sample=False; pass "
                                     "temperature=0 in the SamplingParams instead")
            own["temperature"] = 0.0
        elif temperature == 0:
            raise ParameterError(f"{where}() got do_sample=True and temperature=0 (greedy); "
                                 "pass a temperature > 0")
        else:
            own[DO_SAMPLE] = True
    return own


def checked_sample_count(n: Any, most: int | None = None) -> int:
    """`n`, the samples of one request, as an int: the one check of it for SamplingParams,
    generate and the Engine (`most`: the sequences that may share a pass). ParameterError
    unless an integer (numpy's included) in [1, most]."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1 or \
            (most is not None and n > most):
        allowed = ">= 1" if most is None else f"in [1, {most}]"
        raise ParameterError(f"n must be an integer {allowed}, got {_short(n)}")
    return int(n)


def sample_count(n: Any, sampling: Any, default: int = 1) -> int:
    """Samples per prompt: `n` when given, else the `n` of `sampling` (a SamplingParams or a
    dict of its fields), else `default`. ParameterError unless an integer >= 1."""
    if n is None:
        n = sampling.get("n") if isinstance(sampling, Mapping) else getattr(sampling, "n", None)
    return checked_sample_count(default if n is None else n)


def _tensor_like(value: Any) -> bool:
    """A torch tensor or a numpy array (read through their shared `shape` and `tolist`)."""
    return hasattr(value, "shape") and hasattr(value, "tolist") and \
        not isinstance(value, (str, bytes))


def token_ids_from_tensor(prompt: Any) -> Any:
    """A 1-D or [1, n] tensor or array of token ids as a list of ints; anything else as is.
    A [b, n] batch with b > 1 is refused: its padding would be read as tokens."""
    if not _tensor_like(prompt):
        return prompt
    shape = tuple(prompt.shape)
    if len(shape) == 2 and shape[0] == 1:
        return prompt[0].tolist()
    if len(shape) == 1:
        return prompt.tolist()
    if len(shape) == 2:
        raise ParameterError(f"a token id tensor of shape {list(shape)} holds {shape[0]} "
                             "prompts, padding included; pass a list of prompts (each 1-D, "
                             "without padding) to run several")
    raise ParameterError(f"a token id tensor must be 1-D or [1, n], got shape {list(shape)}")


def several_prompts(prompt: Any) -> list[Any] | None:
    """The prompts of a batch (a list or tuple of texts, of token id lists, of chat message
    lists or of tensors), or None when `prompt` is one prompt (text, token ids, chat
    messages, a 1-D or [1, n] tensor)."""
    if isinstance(prompt, (str, bytes)) or _tensor_like(prompt) or \
            not isinstance(prompt, Sequence) or not prompt:
        return None
    first = prompt[0]
    # A numpy integer scalar has a shape too, (): a list of them is one prompt of token ids.
    if isinstance(first, str) or (_tensor_like(first) and len(first.shape) > 0) or \
            (isinstance(first, Sequence) and not isinstance(first, bytes)):
        return list(prompt)
    return None
