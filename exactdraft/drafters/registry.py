"""The drafters by spec name: one table that the command line, its help and its checks read.

A spec names one drafter (`lookup`, `head`, `head:PATH`, `model:PATH`, ...), several joined by
`+` (a FallbackDrafter: the first with a guess drafts each pass), or `none`. Adding a drafter is
its module and one row of DRAFTERS.

Invariant: `parse` refuses every spec that `build` could not build (an unknown name, a missing
or superfluous PATH, `none` inside a `+` chain, a head folder that is not there) with a
ParameterError naming the offending part, before anything loads; `build` only builds what
`parse` accepted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from exactdraft.arguments import is_drafter_factory
from exactdraft.drafters.draft_model import DraftModel
from exactdraft.drafters.fallback import FallbackDrafter
from exactdraft.drafters.head import DraftHead
from exactdraft.drafters.prompt_lookup import PromptLookup
from exactdraft.drafters.suffix import SuffixDrafter
from exactdraft.errors import ParameterError

NONE = "none"  # the spec for serial decoding: no drafter
JOIN = "+"  # joins specs into a FallbackDrafter


def _existing_folder(path: str, where: str, spec: str) -> None:
    if not os.path.isdir(os.path.expanduser(path)):
        raise ParameterError(f"{where} {spec}: no folder there (train-drafter writes one)")


@dataclass(frozen=True)
class DrafterKind:
    """One row: a spec name and how to build what it names.

    `build(path, max_draft, load_options)` returns a drafter, or a function of the target
    that returns one (for drafters built on the target); its `path` is the text after
    `name:`, None when the spec has none. The row's `path` says whether a PATH is required
    ("required"), allowed ("optional") or refused (None), and `path_means` what it is."""

    name: str
    means: str  # for the help text
    build: Callable[[str | None, int, Mapping[str, Any]], Any]
    default_max_draft: int
    path: str | None = None
    path_means: str = ""
    path_help: str = ""  # what name:PATH builds, when the name alone builds something else
    check_path: Callable[[str, str, str], None] | None = None


DRAFTERS: tuple[DrafterKind, ...] = (
    DrafterKind("lookup", "prompt lookup",
                lambda path, depth, options: PromptLookup(max_draft=depth), 8),
    DrafterKind("suffix", "suffix matching over the prompt and earlier replies",
                lambda path, depth, options: SuffixDrafter(max_draft=depth), 8),
    DrafterKind("head", "the draft head bundled for the model",
                lambda path, depth, options: lambda target: DraftHead.from_pretrained(
                    path, target, max_draft=depth), 4,
                path="optional", path_means="the head's folder",
                path_help="a head from train-drafter", check_path=_existing_folder),
    DrafterKind("model", "a smaller model with the same vocabulary",
                lambda path, depth, options: DraftModel.from_pretrained(
                    path, max_draft=depth, **options), 4,
                path="required", path_means="the draft model's path"),
)


def kind(name: str) -> DrafterKind | None:
    return next((row for row in DRAFTERS if row.name == name), None)


def spellings() -> list[str]:
    """Every way to write one part of a spec: lookup, head, head:PATH, model:PATH, ..."""
    names = []
    for row in DRAFTERS:
        if row.path != "required":
            names.append(row.name)
        if row.path is not None:
            names.append(f"{row.name}:PATH")
    return names


def usage() -> str:
    """The valid specs in a few words, for error messages."""
    return f"use {', '.join(spellings())}, several joined by {JOIN}, or {NONE}"


def help_text(default: str) -> str:
    """--drafter's help: every row, the joining rule and the default."""
    parts = []
    for row in DRAFTERS:
        spelled = f"{row.name}:PATH" if row.path == "required" else row.name
        parts.append(f"{spelled} ({row.means})")
        if row.path == "optional":
            parts.append(f"{row.name}:PATH ({row.path_help})")
    first, second = DRAFTERS[0].name, next(r.name for r in DRAFTERS if r.path == "optional")
    return (f"{', '.join(parts)}, several joined by {JOIN} (the first with a guess drafts, "
            f"e.g. {first}{JOIN}{second}), or {NONE} (default: {default})")


def max_draft_help() -> str:
    """--max-draft's help: each row's default depth."""
    by_depth: dict[int, list[str]] = {}
    for row in DRAFTERS:
        by_depth.setdefault(row.default_max_draft, []).append(row.name)
    said = "; ".join(f"{depth} for {', '.join(names)}" for depth, names in by_depth.items())
    return f"most drafts per pass (default: {said})"


@dataclass(frozen=True)
class Part:
    kind: DrafterKind
    path: str | None


def parse(spec: str, where: str = "drafter") -> list[Part]:
    """The parts of `spec`, each checked (ParameterError naming the part); [] for `none`.
    `where` prefixes messages about a part's PATH (the command line passes "--drafter")."""
    if not isinstance(spec, str):
        raise ParameterError(f"a drafter spec must be a string, got {spec!r}")
    if spec == NONE:
        return []
    parts = []
    for text in spec.split(JOIN):
        name, colon, path = text.partition(":")
        row = kind(name)
        if row is None or (colon and row.path is None) or \
                (not colon and row.path == "required"):
            raise ParameterError(f"unknown drafter {text!r}: {usage()}")
        if colon and not path:
            raise ParameterError(f"{where} {name}:PATH needs {row.path_means}")
        if colon and row.check_path is not None:
            row.check_path(path, where, text)
        parts.append(Part(row, path if colon else None))
    return parts


def build(spec: str, max_draft: int | None = None,
          load_options: Mapping[str, Any] | None = None) -> Any:
    """What `spec` names: a drafter, a function of the target that returns one (give either
    to Generator.from_pretrained as drafter=), or None for `none`. `max_draft` overrides each
    row's default depth; `load_options` (backend, device, dtype, keep_quantized) load a draft
    model the way the target was loaded."""
    parts = parse(spec)
    built = [part.kind.build(part.path, max_draft or part.kind.default_max_draft,
                             load_options or {}) for part in parts]
    if not built:
        return None
    if len(built) == 1:
        return built[0]
    return lambda target: FallbackDrafter(*(
        part(target) if is_drafter_factory(part) else part for part in built))
