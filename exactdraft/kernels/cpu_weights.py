"""Weight matrices packed for the CPU kernels, in their stored formats.

Invariant: packing only moves bytes: every layout holds the checkpoint's own values (float32,
bfloat16 bit patterns or GGUF q8_0/q4_0/q4_1 blocks, never a dequantized copy), arranged so the
kernel reads one sequential stream; the arithmetic a weight takes part in is fixed by its format
and K alone.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.formats.table import FORMATS as FORMAT_ROWS
from exactdraft.formats.table import QuantizedTensor
from exactdraft.kernels.cpu_arrays import address_of, is_torch

# The formats the kernels multiply, by their kernel code (csrc/cpu/formats.h).
FORMAT_CODES = {row.name: row.kernel for row in FORMAT_ROWS.values() if row.kernel is not None}
FORMATS = tuple(sorted(FORMAT_CODES, key=FORMAT_CODES.get))
BLOCK_SIZE = 32  # the weights the grouped layout interleaves, and the dot layout's block
_FLOAT32 = np.dtype(np.float32)
LAYOUTS = ("grouped", "rows", "dot")
LAYOUT_CODES = {"rows": 0, "grouped": 1, "dot": 2}  # enum weight_layout in kernels.h
WEIGHT_GROUP = 4  # rows whose blocks the grouped layout interleaves (WEIGHT_GROUP in kernels.h)
DOT_GROUP = 16  # rows whose blocks the dot layout interleaves (DOT_GROUP in kernels.h)


@dataclass(frozen=True, eq=False)
class PackedMatrix:
    """A weight matrix [N, K] ready for `matmul`, in its stored format.

    layout "rows": `data` is the caller's array used in place: float32 [N, K] (f32), uint16 or
    torch bfloat16 bit patterns [N, K] (bf16), or uint8 GGUF blocks [N, K / 32 * block bytes].
    layout "grouped": `data` is a uint8 array of the same size holding the same blocks (32
    weights each, as stored) with the blocks of every WEIGHT_GROUP consecutive rows interleaved,
    so that the kernel reads one sequential stream; values and arithmetic are unchanged.
    layout "dot" (the formats whose row has integer_dot): uint8 [N / 16 rounded up, K / 32 *
    record bytes], the same values rearranged per group of DOT_GROUP rows for the integer-dot
    kernel (kernels.h says how). `matmul` with it quantizes each activation row to int8 per
    block of 32 (see `quantize_rows`) and sums each block exactly in integers, as llama.cpp
    does: faster, and about 1e-2 relative error instead of float32 rounding.
    """

    format: str
    shape: tuple[int, int]
    data: Any
    layout: str = "rows"

    @property
    def address(self) -> Any:
        return self.data if type(self.data) is np.ndarray else self.data.data_ptr()

    @property
    def layout_code(self) -> int:
        return LAYOUT_CODES[self.layout]


def _row_bytes(format: str, depth: int) -> int:
    row = FORMAT_ROWS[format]
    if depth % row.block_size:
        raise ValueError(f"{format} weights need K to be a multiple of {row.block_size}, got "
                         f"{depth}")
    return row.row_bytes(depth)


def _bytes_per_block(format: str) -> int:
    """Bytes of BLOCK_SIZE consecutive weights of a row."""
    row = FORMAT_ROWS[format]
    return BLOCK_SIZE // row.block_size * row.block_bytes


def _as_bytes(data: Any) -> np.ndarray:
    """The rows of a packed array as a uint8 numpy view [N, row bytes] (no copy)."""
    if is_torch(data):
        torch = sys.modules["torch"]
        if data.dtype is torch.bfloat16:
            data = data.view(torch.int16)
        data = data.numpy()
    return data.view(np.uint8).reshape(data.shape[0], -1)


def _group_rows(rows: np.ndarray, block_bytes: int) -> np.ndarray:
    """A copy of uint8 rows [N, row bytes] in the grouped layout (see PackedMatrix)."""
    count, row_bytes = rows.shape
    blocks = row_bytes // block_bytes
    grouped = np.empty_like(rows)
    full = count // WEIGHT_GROUP * WEIGHT_GROUP
    grouped[:full].reshape(full // WEIGHT_GROUP, blocks, WEIGHT_GROUP, block_bytes)[...] = (
        rows[:full].reshape(full // WEIGHT_GROUP, WEIGHT_GROUP, blocks, block_bytes)
        .transpose(0, 2, 1, 3))
    rest = count - full
    if rest:
        grouped[full:].reshape(blocks, rest, block_bytes)[...] = (
            rows[full:].reshape(rest, blocks, block_bytes).transpose(1, 0, 2))
    return grouped


def _dot_records(rows: np.ndarray, format: str, depth: int, native: Any = None) -> np.ndarray:
    """A copy of uint8 GGUF rows [N, row bytes] in the dot layout (kernels.h), packed by the
    extension (csrc/cpu/pack_dot.c; `native`: another build of it): per group of DOT_GROUP rows
    and block of 32 weights, the 16 rows' parameters then their codes."""
    if native is None:
        from exactdraft import _cpu_kernels as native

    code = FORMAT_ROWS[format].kernel
    record_bytes = {row[0]: row[5] for row in native.format_table()}[code]
    groups = -(-rows.shape[0] // DOT_GROUP)
    records = np.empty((groups, depth // BLOCK_SIZE * record_bytes), np.uint8)
    rows = np.ascontiguousarray(rows)
    native.pack_dot(code, rows.ctypes.data, rows.shape[0], depth, records.ctypes.data)
    return records


def pack_matrix(weight: Any, format: str | None = None, depth: int | None = None,
                layout: str = "grouped") -> PackedMatrix:
    """Prepare a weight matrix [N, K] for `matmul`.

    Accepts a QuantizedTensor (its raw blocks), a float32 numpy array or torch tensor (f32), a
    torch bfloat16 tensor or a uint16 numpy array with format="bf16", or raw uint8 GGUF blocks
    [N, row bytes] with format="q8_0"/"q4_0"/"q4_1" and depth=K. Other float numpy dtypes are
    converted to float32. layout="rows" uses the data in place; layout="grouped" (faster when
    weights stream from memory) copies it once into the grouped layout of the same size, and
    falls back to "rows" when K is not a multiple of 32; layout="dot" (block formats only)
    copies it into the integer-dot layout, which quantizes activations (see PackedMatrix).
    """
    if isinstance(weight, PackedMatrix):
        return weight
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    packed = _pack_rows(weight, format, depth)
    if layout == "dot":
        if not FORMAT_ROWS[packed.format].integer_dot:
            known = ", ".join(name for name, row in FORMAT_ROWS.items() if row.integer_dot)
            raise ValueError(f"the dot layout needs weights in {known}, not {packed.format}")
        records = _dot_records(_as_bytes(packed.data), packed.format, packed.shape[1])
        return PackedMatrix(packed.format, packed.shape, records, "dot")
    if not FORMAT_ROWS[packed.format].float_kernel:
        raise ValueError(f"{packed.format} weights are multiplied in the dot layout only "
                         f"(int8 activations), not the {layout!r} layout")
    if layout == "rows" or packed.shape[1] % BLOCK_SIZE:
        return packed
    grouped = _group_rows(_as_bytes(packed.data), _bytes_per_block(packed.format))
    return PackedMatrix(packed.format, packed.shape, grouped, "grouped")


def _pack_rows(weight: Any, format: str | None, depth: int | None) -> PackedMatrix:
    if format is not None and format not in FORMAT_CODES:
        raise ValueError(f"unknown weight format {format!r}; known: {', '.join(FORMATS)}")
    if isinstance(weight, QuantizedTensor):
        if format not in (None, weight.format):
            raise ValueError(f"format {format!r} does not match the {weight.format} weight")
        rows, depth = weight.shape
        data = np.ascontiguousarray(weight.data)
        address_of(data, "weight.data", "uint8", (rows, _row_bytes(weight.format, depth)))
        return PackedMatrix(weight.format, (rows, depth), data)
    if is_torch(weight):
        torch = sys.modules["torch"]
        dtype_name = {torch.float32: "float32", torch.bfloat16: "bfloat16",
                      torch.uint8: "uint8"}.get(weight.dtype)
        if dtype_name is None:
            raise TypeError(f"weight dtype {weight.dtype} is not supported; use float32, "
                            "bfloat16 or uint8 GGUF blocks")
        array_format = {"float32": "f32", "bfloat16": "bf16"}.get(dtype_name, format)
    elif isinstance(weight, np.ndarray):
        dtype_name = weight.dtype.name
        if weight.dtype.kind == "f" and weight.dtype != _FLOAT32 and format in (None, "f32"):
            weight, dtype_name = np.ascontiguousarray(weight, dtype=np.float32), "float32"
        array_format = {"float32": "f32", "uint16": "bf16"}.get(dtype_name, format)
    else:
        raise TypeError(f"weight must be a QuantizedTensor, numpy array or torch tensor, got "
                        f"{type(weight).__name__}")
    if format is not None and array_format != format:
        raise ValueError(f"a {dtype_name} weight cannot be used as format {format!r}")
    if array_format is None:
        raise ValueError(f"a {dtype_name} weight needs format= one of {', '.join(FORMATS)}")
    if weight.ndim != 2:
        raise ValueError(f"weight must be 2-D [N, K] or [N, row bytes], got shape "
                         f"{list(weight.shape)}")
    rows = int(weight.shape[0])
    if array_format in ("f32", "bf16"):
        depth = int(weight.shape[1])
    elif depth is None:
        raise ValueError(f"raw {array_format} blocks need depth=K")
    width = depth if array_format in ("f32", "bf16") else _row_bytes(array_format, depth)
    address_of(weight, "weight", dtype_name, (rows, width))
    return PackedMatrix(array_format, (rows, depth), weight)
