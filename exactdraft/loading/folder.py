"""Reading a Hugging Face model folder: config.json, safetensors weights, tokenizer files.

Invariant: weights come only from safetensors files, nothing executable; a folder without them,
with a shard its index names but that is missing, or with a config.json that is not a JSON object
is refused here with the file named. Nothing is built: the config stays the raw mapping its
family will read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exactdraft.errors import CheckpointError
from exactdraft.loading.affine import AffineTensors, quantization_settings
from exactdraft.loading.fp8_blocks import FP8BlockTensors, fp8_block_settings
from exactdraft.loading.safetensors_file import SafetensorsTensors


@dataclass
class FolderFiles:
    config: dict[str, Any]  # config.json as read
    tensors: Mapping[str, Any]
    folder: str
    generation_config: dict[str, Any] | None = None  # generation_config.json, when present


def read_json_object(path: str) -> dict[str, Any]:
    """A JSON file that must hold an object, or a CheckpointError naming the file."""
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: cannot be read as JSON ({error})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: must hold a JSON object, got {type(value).__name__}")
    return value


def safetensors_files(folder: str) -> list[str]:
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        weight_map = read_json_object(index).get("weight_map", {})
        if not isinstance(weight_map, dict) or not all(isinstance(f, str)
                                                       for f in weight_map.values()):
            raise CheckpointError(f"{index}: weight_map must map tensor names to file names")
        files = sorted(set(weight_map.values()))
        for name in files:
            if os.path.basename(name) != name:
                raise CheckpointError(f"{index}: shard {name!r} is not a file in the folder")
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


def read_folder(folder: str, keep_quantized: bool = False) -> FolderFiles:
    """The config, the weights (lazily read) and the generation config of a folder;
    keep_quantized keeps block-scaled FP8 matrices in their codes (loading/fp8_blocks.py)."""
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        raise CheckpointError(f"{folder}: no config.json")
    raw = read_json_object(config_path)
    tensors: Mapping[str, Any] = SafetensorsTensors(safetensors_files(folder))
    quantization = quantization_settings(raw, config_path)
    if quantization is not None:
        tensors = AffineTensors(tensors, **quantization)
    fp8_block = fp8_block_settings(raw, config_path)
    if fp8_block is not None:
        tensors = FP8BlockTensors(tensors, fp8_block, keep_quantized)
    generation_path = os.path.join(folder, "generation_config.json")
    generation = read_json_object(generation_path) if os.path.isfile(generation_path) else None
    return FolderFiles(raw, tensors, folder, generation)
