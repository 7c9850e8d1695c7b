"""Reading GGUF files: metadata as Python values, tensors as views of one memory map.

Invariant: a GGUF file is untrusted input. Every count, length, offset and type in it is checked
against the file's size and the known types before it is used, so a truncated or corrupt file
fails with a GGUFError naming the file and the field, never with an IndexError or a huge
allocation. Tensors are not copied: each is a uint8 view of the file's memory map, handed out as
the values it stores (float32 arrays for F32/F16/BF16, QuantizedTensor blocks or their float32
dequantization for block formats), in the row-major [rows, K] layout of Hugging Face weights.
Nothing here knows about model families: it reads, and builds nothing.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.errors import GGUFError, WeightError
from exactdraft.formats.table import FORMATS, QuantizedTensor, WeightFormat, format_for_ggml_type

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_NUMPY_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
                  7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_MAX_DIMS = 4
# GGUF tensor types exactdraft does not read, named in its refusal.
_UNREAD_TYPES = {9: "Q8_1", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
                 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8",
                 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 39: "MXFP4"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    format: WeightFormat
    shape: tuple[int, ...]  # Hugging Face order: rows first (GGUF lists dimensions reversed)
    offset: int  # bytes from the start of the file
    size: int  # bytes


class _Cursor:
    """Bounds-checked little-endian reads from a bytes-like buffer."""

    def __init__(self, data: Any, path: str) -> None:
        self.data, self.path, self.at = data, path, 0

    def fail(self, what: str) -> GGUFError:
        return GGUFError(f"{self.path}: truncated or corrupt GGUF file ({what} at byte "
                         f"{self.at} of {len(self.data)})")

    def take(self, count: int, what: str) -> memoryview:
        if count < 0 or self.at + count > len(self.data):
            raise self.fail(what)
        view = self.data[self.at:self.at + count]
        self.at += count
        return view

    def scalar(self, kind: int, what: str) -> Any:
        code = _SCALARS[kind]
        return struct.unpack(code, self.take(struct.calcsize(code), what))[0]

    def string(self, what: str) -> str:
        length = self.scalar(10, what)
        raw = self.take(length, what)
        try:
            return str(raw, "utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"{self.path}: {what} is not valid UTF-8") from None

    def value(self, kind: int, what: str) -> Any:
        if kind in _SCALARS:
            return self.scalar(kind, what)
        if kind == _STRING:
            return self.string(what)
        if kind != _ARRAY:
            raise GGUFError(f"{self.path}: {what} has unknown value type {kind}")
        item_kind = self.scalar(4, what)
        count = self.scalar(10, what)
        if item_kind in _NUMPY_SCALARS:
            dtype = np.dtype(_NUMPY_SCALARS[item_kind])
            raw = self.take(count * dtype.itemsize, what)
            return np.frombuffer(raw, dtype=dtype).tolist()
        if item_kind == _STRING:
            if count > len(self.data) // 8:
                raise self.fail(what)
            return [self.string(what) for _ in range(count)]
        raise GGUFError(f"{self.path}: {what} is an array of unsupported type {item_kind}")


class GGUFFile:
    """The metadata and tensor table of one GGUF file, over a read-only memory map."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = path = os.fspath(path)
        if not os.path.isfile(path):
            raise GGUFError(f"no GGUF file at {path}")
        size = os.path.getsize(path)
        if size < 24:
            raise GGUFError(f"{path}: truncated GGUF file ({size} bytes)")
        self._map = np.memmap(path, dtype=np.uint8, mode="r")
        cursor = _Cursor(memoryview(self._map), path)
        if bytes(cursor.take(4, "magic")) != MAGIC:
            raise GGUFError(f"{path}: not a GGUF file (no GGUF magic at the start)")
        version = cursor.scalar(4, "version")
        if version not in VERSIONS:
            raise GGUFError(f"{path}: GGUF version {version} is not supported (supported: "
                            f"{', '.join(map(str, VERSIONS))}; a byte-swapped file reads as a "
                            "huge version)")
        tensor_count = cursor.scalar(10, "tensor count")
        field_count = cursor.scalar(10, "metadata count")
        if tensor_count > size // 24 or field_count > size // 12:
            raise cursor.fail("tensor or metadata count")
        self.fields: dict[str, Any] = {}
        for index in range(field_count):
            key = cursor.string(f"metadata key {index}")
            kind = cursor.scalar(4, f"metadata {key!r}")
            self.fields[key] = cursor.value(kind, f"metadata {key!r}")
        raw_infos = []
        for index in range(tensor_count):
            name = cursor.string(f"tensor name {index}")
            dims = cursor.scalar(4, f"tensor {name!r}")
            if not 1 <= dims <= _MAX_DIMS:
                raise GGUFError(f"{path}: tensor {name!r} has {dims} dimensions")
            shape = [cursor.scalar(10, f"tensor {name!r}") for _ in range(dims)]
            kind = cursor.scalar(4, f"tensor {name!r}")
            offset = cursor.scalar(10, f"tensor {name!r}")
            raw_infos.append((name, shape, kind, offset))
        alignment = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
            raise GGUFError(f"{path}: general.alignment {alignment!r} is not a power of two")
        data_start = -(-cursor.at // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, kind, offset in raw_infos:
            self.tensors[name] = self._info(name, shape, kind, data_start + offset, size)

    def _info(self, name: str, shape: list[int], kind: int, offset: int,
              size: int) -> TensorInfo:
        path = self.path
        row = format_for_ggml_type(kind)
        if row is None:
            kind_name = _UNREAD_TYPES.get(kind, f"{kind} (unknown)")
            supported = (f.name.upper() for f in FORMATS.values() if f.ggml_type is not None)
            raise WeightError(f"{path}: tensor {name!r} has type {kind_name}, which is not "
                              f"supported; supported: {', '.join(supported)}")
        if name in self.tensors:
            raise GGUFError(f"{path}: tensor {name!r} appears twice")
        if any(d < 1 for d in shape) or int(np.prod(shape, dtype=np.float64)) > size * 8:
            raise GGUFError(f"{path}: tensor {name!r} has impossible shape {shape}")
        if shape[0] % row.block_size:
            raise WeightError(f"{path}: tensor {name!r} ({row.name}) has a row of {shape[0]} "
                              f"weights, not a multiple of the {row.block_size}-weight block")
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count // row.block_size * row.block_bytes
        if offset + nbytes > size:
            raise GGUFError(f"{path}: truncated GGUF file: tensor {name!r} ends at byte "
                            f"{offset + nbytes} of {size}")
        return TensorInfo(name, row, tuple(reversed(shape)), offset, nbytes)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes as uint8 [rows, row bytes] (a view of the map)."""
        info = self.tensors[name]
        depth = info.shape[-1]
        rows = int(np.prod(info.shape[:-1], dtype=np.int64)) if len(info.shape) > 1 else 1
        view = self._map[info.offset:info.offset + info.size]
        return view.reshape(rows, info.format.row_bytes(depth))

    def tensor(self, name: str, keep_quantized: bool = True) -> np.ndarray | QuantizedTensor:
        """The tensor's values: float32 for dense types; a QuantizedTensor for 2-D block
        formats when keep_quantized, else their float32 dequantization."""
        info = self.tensors[name]
        raw = self.raw(name)
        kind = info.format.name
        if kind == "f32":
            return raw.view(np.float32).reshape(info.shape)
        if kind == "f16":
            return raw.view(np.float16).astype(np.float32).reshape(info.shape)
        if kind == "bf16":
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(
                info.shape)
        quantized = QuantizedTensor(kind, raw, (raw.shape[0], info.shape[-1]))
        if keep_quantized and len(info.shape) == 2:
            return quantized
        return quantized.dequantize().reshape(info.shape)


class GGUFTensors(Mapping):
    """GGUF name -> tensor values (read on access), with shapes known without reading."""

    def __init__(self, file: GGUFFile, keep_quantized: bool = True) -> None:
        self.file, self.keep_quantized = file, keep_quantized

    def __getitem__(self, name: str) -> Any:
        if name not in self.file.tensors:
            raise KeyError(name)
        return self.file.tensor(name, self.keep_quantized)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.file.tensors[name].shape

    def is_block_quantized(self, name: str) -> bool:
        """Whether the tensor is stored in a block format (not F32, F16 or BF16)."""
        return self.file.tensors[name].format.quantized

    def stacked_entry(self, name: str, index: int) -> np.ndarray | QuantizedTensor:
        """Entry `index` [rows, K] of a block-quantized stack [E, rows, K] (the experts of a
        mixture-of-experts layer): its blocks as the file stores them when keep_quantized,
        else their float32 dequantization, decoding only its rows."""
        info = self.file.tensors[name]
        if len(info.shape) != 3 or not info.format.quantized or not 0 <= index < info.shape[0]:
            raise WeightError(f"{self.file.path}: tensor {name!r} ({info.format.name}, "
                              f"{info.shape}) has no stacked entry {index}")
        _, rows, depth = info.shape
        blocks = self.file.raw(name)[index * rows:(index + 1) * rows]
        matrix = QuantizedTensor(info.format.name, blocks, (rows, depth))
        return matrix if self.keep_quantized else matrix.dequantize()

    def __iter__(self) -> Iterator[str]:
        return iter(self.file.tensors)

    def __len__(self) -> int:
        return len(self.file.tensors)


def read_gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All key/value metadata of a GGUF file (tokenizer arrays included) as Python values."""
    return GGUFFile(path).fields
