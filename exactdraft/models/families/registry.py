"""Model families by Hugging Face `model_type` and GGUF `general.architecture`.

Invariant: a checkpoint reaches a model only through its family's own config mapping, tensor
naming and builder; a model type or architecture no family claims is refused with the file and
the supported names listed. Built-in families are imported on first use (one module each), and
`register_family` adds one without touching this file.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from exactdraft.errors import ConfigError
from exactdraft.models.split import TensorParallelSplit, not_split


@dataclass(frozen=True)
class Family:
    """What exactdraft needs to know of a model family.

    - config_from_hf(raw config.json, path) and config_from_gguf(metadata, tensor shapes by GGUF
      name, path) -> the model's config;
    - hf_tensors(config, tensors by Hugging Face name) and gguf_tensors(config, tensors by GGUF
      name, path) -> tensors under the names `build` reads, in the layout it expects;
    - build(config, tensors, backend, max_context) -> a Target;
    - tensor_parallel(config) -> how its weights split across ranks (models/split.py), or None
      where the family is not split.
    """

    name: str
    model_types: tuple[str, ...]
    gguf_architectures: tuple[str, ...]
    config_from_hf: Callable[[Mapping[str, Any], str], Any]
    config_from_gguf: Callable[[Mapping[str, Any], Mapping[str, tuple[int, ...]], str], Any]
    hf_tensors: Callable[[Any, Mapping[str, Any]], Mapping[str, Any]]
    gguf_tensors: Callable[[Any, Mapping[str, Any], str], Mapping[str, Any]]
    build: Callable[..., Any]
    tensor_parallel: Callable[[Any], TensorParallelSplit | None] = not_split


# model_type or architecture -> the module whose FAMILY claims it.
_BUILTIN_MODULES = {
    "llama": "exactdraft.models.families.llama",
    "mistral": "exactdraft.models.families.llama",
    "qwen2": "exactdraft.models.families.llama",
    "qwen3": "exactdraft.models.families.llama",
    "gemma3": "exactdraft.models.families.gemma3",
    "gemma3_text": "exactdraft.models.families.gemma3",
    "qwen3_moe": "exactdraft.models.families.qwen3_moe",
    "qwen3moe": "exactdraft.models.families.qwen3_moe",
    "mixtral": "exactdraft.models.families.qwen3_moe",
    "qwen3_next": "exactdraft.models.families.qwen3_next",
    "qwen3_5": "exactdraft.models.families.qwen3_next",
    "qwen3_5_text": "exactdraft.models.families.qwen3_next",
    "qwen3_5_moe": "exactdraft.models.families.qwen3_next",
    "qwen3_5_moe_text": "exactdraft.models.families.qwen3_next",
    "qwen3next": "exactdraft.models.families.qwen3_next",
    "qwen35": "exactdraft.models.families.qwen3_next",
    "qwen35moe": "exactdraft.models.families.qwen3_next",
    "nemotron_h": "exactdraft.models.families.nemotron_h",
    "nemotron_h_moe": "exactdraft.models.families.nemotron_h",
    "lfm2": "exactdraft.models.families.lfm2",
    "gemma4": "exactdraft.models.families.gemma4",
    "gemma4_text": "exactdraft.models.families.gemma4",
    "deepseek_v3": "exactdraft.models.families.deepseek_v3",
    "deepseek2": "exactdraft.models.families.deepseek_v3",
    "glm4_moe": "exactdraft.models.families.glm4_moe",
    "glm4moe": "exactdraft.models.families.glm4_moe",
    "gpt_oss": "exactdraft.models.families.gpt_oss",
    "gpt-oss": "exactdraft.models.families.gpt_oss",
}
_REGISTERED: list[Family] = []


def register_family(family: Family) -> None:
    """Make checkpoints of the family's model types and architectures load."""
    _REGISTERED.insert(0, family)


def _families() -> list[Family]:
    modules = dict.fromkeys(_BUILTIN_MODULES.values())
    return _REGISTERED + [importlib.import_module(m).FAMILY for m in modules]


def _lookup(kind: str, value: Any, source: str, claims: Callable[[Family], tuple[str, ...]]
            ) -> Family:
    module = _BUILTIN_MODULES.get(value) if isinstance(value, str) else None
    for family in _REGISTERED:
        if value in claims(family):
            return family
    if module is not None:
        return importlib.import_module(module).FAMILY
    supported = sorted({name for family in _families() for name in claims(family)})
    raise ConfigError(f"{source}: unsupported {kind} {value!r}; supported: "
                      f"{', '.join(supported)}")


def family_for_model_type(model_type: Any, source: str) -> Family:
    """The family of a config.json `model_type`, or a ConfigError naming the file."""
    return _lookup("model_type", model_type, source, lambda f: f.model_types)


def family_for_architecture(architecture: Any, source: str) -> Family:
    """The family of a GGUF `general.architecture`, or a ConfigError naming the file."""
    return _lookup("GGUF architecture", architecture, source, lambda f: f.gguf_architectures)


def supported_model_types() -> list[str]:
    return sorted({name for family in _families() for name in family.model_types})
