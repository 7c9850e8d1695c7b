"""Checks of the arguments that build a Generator, made before anything loads or runs.

Invariant: a wrong argument (a drafter passed where the backend goes, a path passed as a model,
a flag that is not a boolean) is refused with a ParameterError that names the argument and the
value it got, before any checkpoint is read or any model pass runs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

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
