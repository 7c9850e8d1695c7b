"""What every rank of a tensor-parallel run must agree on before it loads a weight: the
checkpoint's files and the settings that decide the bits.

Invariant: two ranks state the same fingerprint only if they read files with the same bytes
(every byte up to FULL_HASH_LIMIT; above it the size, the first MiB and 64 MiB-spaced samples,
which tell apart any two different checkpoints of a model in practice) and run with the same
model configuration, context, arithmetic contract and SIMD level: the inputs of every bit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any

FULL_HASH_LIMIT = 2 << 30
_CHUNK = 1 << 20
_SAMPLES = 64
# Files of a checkpoint folder that carry weights or settings.
_FOLDER_FILES = ("config.json", "generation_config.json")
_FOLDER_SUFFIXES = (".safetensors", ".safetensors.index.json")


def checkpoint_files(source: str) -> list[str]:
    """The files whose bytes decide a checkpoint's weights and settings."""
    if os.path.isfile(source):
        return [source]
    names = sorted(name for name in os.listdir(source)
                   if name in _FOLDER_FILES or name.endswith(_FOLDER_SUFFIXES))
    return [os.path.join(source, name) for name in names]


def file_digest(path: str) -> str:
    """sha256 of a file's bytes (sampled above FULL_HASH_LIMIT, see the module docstring)."""
    size = os.path.getsize(path)
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        if size <= FULL_HASH_LIMIT:
            for block in iter(lambda: handle.read(_CHUNK), b""):
                digest.update(block)
        else:
            for index in range(_SAMPLES + 1):
                handle.seek(0 if index == 0 else (size - _CHUNK) * index // _SAMPLES)
                digest.update(handle.read(_CHUNK))
    return digest.hexdigest()


def run_fingerprint(checkpoint: Any, backend: Any, world_size: int,
                    max_context: int | None) -> str:
    """One line every rank must state identically (ParallelGroup.agree)."""
    from exactdraft import __version__
    from exactdraft.kernels import cpu

    files = hashlib.sha256()
    for path in checkpoint_files(str(checkpoint.source)):
        files.update(f"{os.path.basename(path)}:{file_digest(path)};".encode())
    config = checkpoint.config
    if dataclasses.is_dataclass(config):
        config = dataclasses.replace(config, source="")  # paths may differ between machines
    settings = hashlib.sha256(repr((config, max_context, world_size, backend.arithmetic,
                                    backend.dtype, backend.key_block, cpu.simd_level(),
                                    __version__)).encode())
    return (f"files {files.hexdigest()[:16]}, settings {settings.hexdigest()[:16]} "
            f"({backend.arithmetic}, simd {cpu.simd_level()}, exactdraft {__version__})")
