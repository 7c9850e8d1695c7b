"""Reading safetensors files with numpy alone, bf16 included, executing nothing from the file.

Invariant: a tensor is handed out only after the whole header has been checked against the file
(every dtype known, every byte range inside the data section and matching its shape), so a
truncated or corrupt file fails at open with the file and tensor named, never mid-model.
Tensors are memory-mapped; float16 and bfloat16 are widened to float32 exactly on access, and
integer tensors (packed quantized weights) are handed out as stored. Float8 tensors are not
handed out as values: `stored` gives their codes, for the block-scaled fp8 reader.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from exactdraft.errors import CheckpointError, WeightError

_DTYPES = {
    "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "F64": np.dtype("<f8"), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "U32": np.dtype("<u4"),
    "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
# Float8 tensors are stored as their one-byte codes; they are handed out only as block-scaled
# weights (exactdraft.loading.fp8_blocks), never as plain tensors.
FLOAT8_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E8M0")
_DTYPES.update({dtype: np.dtype("u1") for dtype in FLOAT8_DTYPES})
_MAX_HEADER = 100 * 1024 * 1024
_MAX_DIMS = 8


@dataclass(frozen=True)
class TensorEntry:
    path: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def bf16_to_float32(raw: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bit patterns (uint16) to float32; exact."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def read_header(path: str) -> dict[str, TensorEntry]:
    """Parse and validate the header of one safetensors file."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes)")
        (header_size,) = struct.unpack("<Q", prefix)
        if header_size > _MAX_HEADER or 8 + header_size > size:
            raise CheckpointError(
                f"{path}: truncated or corrupt safetensors file (header of {header_size} bytes "
                f"in a file of {size} bytes)"
            )
        try:
            header = json.loads(handle.read(header_size))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{path}: corrupt safetensors header ({error})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (a JSON "
                              f"{type(header).__name__}, not an object)")
    data_start = 8 + header_size
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise CheckpointError(f"{path}: tensor {name!r} has a header entry that is not an "
                                  "object")
        dtype = info.get("dtype")
        if dtype not in _DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}")
        shape = _integers(info.get("shape"), path, name, "shape", None)
        if len(shape) > _MAX_DIMS:
            raise CheckpointError(f"{path}: tensor {name!r} has {len(shape)} dimensions")
        begin, end = _integers(info.get("data_offsets"), path, name, "data_offsets", 2)
        expected = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype].itemsize
        if begin > end or end - begin != expected:
            raise CheckpointError(
                f"{path}: tensor {name!r} of shape {shape} needs {expected} bytes, "
                f"header gives {end - begin}"
            )
        if data_start + end > size:
            raise CheckpointError(
                f"{path}: truncated safetensors file: tensor {name!r} ends at byte "
                f"{data_start + end} but the file has {size} bytes"
            )
        entries[name] = TensorEntry(path, dtype, shape, data_start + begin, data_start + end)
    return entries


def _integers(value: object, path: str, name: str, field: str,
              count: int | None) -> tuple[int, ...]:
    """A header list of non-negative integers (of `count` items when given)."""
    if not isinstance(value, list) or (count is not None and len(value) != count) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        wanted = f"{count} " if count else ""
        raise CheckpointError(f"{path}: tensor {name!r} needs {field} as a list of "
                              f"{wanted}non-negative integers, got {value!r}")
    return tuple(value)


class SafetensorsTensors(Mapping):
    """Name -> numpy array (lazily read) over one or more safetensors files."""

    def __init__(self, paths: list[str]) -> None:
        self.entries: dict[str, TensorEntry] = {}
        for path in paths:
            self.entries.update(read_header(path))
        self._maps: dict[str, np.memmap] = {}

    def stored(self, name: str) -> np.ndarray:
        """The tensor's elements as stored: bfloat16 as uint16 bits, float8 as uint8 codes."""
        entry = self.entries[name]
        if entry.path not in self._maps:
            self._maps[entry.path] = np.memmap(entry.path, dtype=np.uint8, mode="r")
        raw = self._maps[entry.path][entry.begin:entry.end].view(_DTYPES[entry.dtype])
        return raw.reshape(entry.shape)

    def __getitem__(self, name: str) -> np.ndarray:
        entry = self.entries[name]
        if entry.dtype in FLOAT8_DTYPES:
            raise WeightError(f"{entry.path}: tensor {name!r} is stored as {entry.dtype}, read "
                              "only as an fp8 weight with its weight_scale_inv under a "
                              "config.json quantization_config of quant_method fp8")
        raw = self.stored(name)
        if entry.dtype == "BF16":
            return bf16_to_float32(raw)
        if entry.dtype in ("F16", "F64"):
            return raw.astype(np.float32)
        return raw  # float32 as stored; integer tensors (packed quantized weights) untouched

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)
