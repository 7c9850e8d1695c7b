"""Weight formats: one row per format, and the containers that keep a matrix in its format.

Invariant: a weight keeps the exact values its checkpoint stores. Every fact about a format (its
GGUF type id, block size and bytes, the numpy block functions that dequantize it and split it
into codes and scales (formats/dequantize.py), which CPU kernel multiplies it, whether MLX's affine
layout holds it losslessly) is in its row of FORMATS and nowhere else in Python;
the C kernels carry the same facts in csrc/cpu/formats.h, and a test holds the two equal.
Stacking the rows of several matrices (q, k and v into one; gate and up into one) only
concatenates output rows, so each output element keeps the K order it would have alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import exactdraft.formats.dequantize as dequantize
import exactdraft.formats.dequantize_lookup as dequantize_lookup
import exactdraft.formats.fp8_e4m3 as fp8_e4m3
import exactdraft.formats.ternary_blocks as ternary_blocks
from exactdraft.errors import WeightError


@dataclass(frozen=True)
class WeightFormat:
    """One weight format: `block_size` weights along K take `block_bytes` bytes."""

    name: str
    ggml_type: int | None  # the GGUF tensor type id; None for a format GGUF has no type for
    block_size: int
    block_bytes: int
    # The CPU kernels' code for the format (csrc/cpu/formats.h), None where the CPU path
    # widens or dequantizes it at load instead.
    kernel: int | None = None
    # Whether the CPU kernels multiply it with float activations (the rows/grouped layouts).
    float_kernel: bool = False
    # Whether the CPU kernels have an integer-dot ("dot" layout) path for it.
    integer_dot: bool = False
    # bits of MLX's affine layout (group 32) that hold the format without changing a value.
    affine_bits: int | None = None
    # dequantize.values_<format>(blocks, out): the exact float32 weights of its blocks.
    values: Callable[[np.ndarray, np.ndarray], None] | None = None
    # dequantize.fields_<format>(blocks): its codes and scales, for formats the CPU packs.
    fields: Callable[[np.ndarray], tuple] | None = None

    @property
    def quantized(self) -> bool:
        return self.block_size > 1

    def row_bytes(self, depth: int) -> int:
        """Bytes of one row of K = depth weights, or a WeightError when K does not fit."""
        if depth % self.block_size:
            raise WeightError(f"{self.name} weights need K to be a multiple of "
                              f"{self.block_size}, got {depth}")
        return depth // self.block_size * self.block_bytes

    def dequantize(self, data: np.ndarray, depth: int) -> np.ndarray:
        """float32 [rows, K] from uint8 rows [rows, row bytes] of this format (ValueError
        naming the format and the expected row bytes when the rows do not fit)."""
        if self.values is None:
            raise WeightError(f"{self.name} is not a block format")
        return dequantize.dequantize_rows(data, depth, self.name, self.block_size,
                                          self.block_bytes, self.values)

    def block_fields(self, data: np.ndarray, depth: int) -> dequantize.BlockFields:
        """The codes and per-group scales of uint8 rows of this format (dequantize.BlockFields)."""
        if self.fields is None:
            known = ", ".join(row.name for row in _ROWS if row.fields is not None)
            raise WeightError(f"{self.name}: no split into codes and scales; known: {known}")
        return dequantize.block_fields(data, depth, self.name, self.block_size,
                                       self.block_bytes, self.fields)


_dq = dequantize
_ROWS = (
    # name, GGUF type, block size, block bytes, kernel code, float kernel, integer dot, affine,
    # block functions
    WeightFormat("f32", 0, 1, 4, kernel=0, float_kernel=True),
    WeightFormat("f16", 1, 1, 2),
    WeightFormat("bf16", 30, 1, 2, kernel=1, float_kernel=True),
    WeightFormat("q8_0", 8, 32, 34, 2, True, True, 8, _dq.values_q8_0, _dq.fields_q8_0),
    WeightFormat("q4_0", 2, 32, 18, 3, True, True, 4, _dq.values_q4_0, _dq.fields_q4_0),
    WeightFormat("q4_1", 3, 32, 20, 4, True, True, 4, _dq.values_q4_1, _dq.fields_q4_1),
    WeightFormat("q5_0", 6, 32, 22, 5, False, True, None, _dq.values_q5_0, _dq.fields_q5_0),
    WeightFormat("q5_1", 7, 32, 24, 6, False, True, None, _dq.values_q5_1, _dq.fields_q5_1),
    WeightFormat("q2_k", 10, 256, 84, 16, False, True, None, _dq.values_q2_k, _dq.fields_q2_k),
    WeightFormat("q3_k", 11, 256, 110, 17, False, True, None, _dq.values_q3_k, _dq.fields_q3_k),
    WeightFormat("q4_k", 12, 256, 144, 7, False, True, None, _dq.values_q4_k, _dq.fields_q4_k),
    WeightFormat("q5_k", 13, 256, 176, 8, False, True, None, _dq.values_q5_k, _dq.fields_q5_k),
    WeightFormat("q6_k", 14, 256, 210, 9, False, True, None, _dq.values_q6_k, _dq.fields_q6_k),
    # 4-bit codes through a 16-entry table (formats/dequantize_lookup.py)
    WeightFormat("iq4_nl", 20, 32, 18, 10, False, True, None, dequantize_lookup.values_iq4_nl,
                 dequantize_lookup.fields_iq4_nl),
    WeightFormat("iq4_xs", 23, 256, 136, 11, False, True, None, dequantize_lookup.values_iq4_xs,
                 dequantize_lookup.fields_iq4_xs),
    WeightFormat("mxfp4", 39, 32, 17, 12, False, True, None, dequantize_lookup.values_mxfp4,
                 dequantize_lookup.fields_mxfp4),
    # Ternary and 1-bit formats (formats/ternary_blocks.py).
    WeightFormat("tq1_0", 34, 256, 54, 13, False, True, None, ternary_blocks.values_tq1_0,
                 ternary_blocks.fields_tq1_0),
    WeightFormat("tq2_0", 35, 256, 66, 14, False, True, None, ternary_blocks.values_tq2_0,
                 ternary_blocks.fields_tq2_0),
    WeightFormat("q1_0", 41, 128, 18, 15, False, True, None, ternary_blocks.values_q1_0,
                 ternary_blocks.fields_q1_0),
    # Block-scaled FP8 checkpoints held in memory (formats/fp8_e4m3.py); no GGUF type.
    WeightFormat("fp8_e4m3", None, 32, 36, 18, True, False, None, fp8_e4m3.values_fp8_e4m3),
)
FORMATS: Mapping[str, WeightFormat] = {row.name: row for row in _ROWS}
_BY_GGML_TYPE = {row.ggml_type: row for row in _ROWS if row.ggml_type is not None}
# The GGUF block formats; QuantizedTensor also holds the block formats GGUF has no type for.
BLOCK_FORMATS = tuple(row.name for row in _ROWS if row.quantized and row.ggml_type is not None)


def weight_format(name: str) -> WeightFormat:
    """The row of a format name, or a WeightError listing the known ones."""
    row = FORMATS.get(name)
    if row is None:
        raise WeightError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}")
    return row


def format_for_ggml_type(type_id: int) -> WeightFormat | None:
    """The row for a GGUF tensor type id, or None for a type exactdraft does not read."""
    return _BY_GGML_TYPE.get(type_id)


class QuantizedTensor:
    """A matrix [N, K] kept in a GGUF block format exactly as the file stores it (or in
    fp8_e4m3, the blocks of a block-scaled FP8 checkpoint): `data` is uint8
    [N, K / block size * block bytes], each row K / block size consecutive blocks."""

    def __init__(self, format: str, data: np.ndarray, shape: tuple[int, int]) -> None:
        row = weight_format(format)
        if not row.quantized:
            raise WeightError(f"{format} is not a block format; known block formats: "
                              f"{', '.join(row.name for row in _ROWS if row.quantized)}")
        rows, cols = shape
        row_bytes = row.row_bytes(cols)
        if data.dtype != np.uint8 or data.shape != (rows, row_bytes):
            raise WeightError(f"{format} data for shape {shape} must be uint8 "
                              f"{(rows, row_bytes)}, got {data.dtype} {data.shape}")
        self.format = format
        self.data = data
        self.shape = (rows, cols)

    def __repr__(self) -> str:
        return f"QuantizedTensor({self.format!r}, shape={self.shape})"

    @property
    def row(self) -> WeightFormat:
        return FORMATS[self.format]

    def stack_rows(self, others: Sequence[Any]) -> Any:
        return stack_rows([self, *others])

    def dequantize(self) -> np.ndarray:
        """float32 [N, K], the values the blocks encode."""
        return self.row.dequantize(self.data, self.shape[1])

    def take_rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids), K]: the rows `ids`, dequantizing only those."""
        return self.row.dequantize(np.ascontiguousarray(self.data[ids]), self.shape[1])

    def digest_parts(self) -> Iterator[Any]:
        yield repr((self.format, self.shape)).encode()
        yield memoryview(np.ascontiguousarray(self.data)).cast("B")

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        dense = self.dequantize()
        return dense if dtype is None else dense.astype(dtype)


class AffineQuantizedTensor:
    """A matrix [N, K] in MLX's affine layout: w = scale * q + bias per group of `group_size`
    consecutive weights along K, with q unsigned `bits`-bit integers packed little-end first
    into uint32 words (`packed` is uint32 [N, K * bits / 32]; scales, biases [N, K / group])."""

    def __init__(self, packed: np.ndarray, scales: np.ndarray, biases: np.ndarray,
                 group_size: int, bits: int) -> None:
        if bits not in (4, 8):
            raise WeightError(f"affine quantization with {bits} bits is not supported (4, 8)")
        if group_size not in (32, 64, 128):
            raise WeightError(f"affine group size {group_size} is not supported (32, 64, 128)")
        if packed.ndim != 2:
            raise WeightError(f"affine packed weight must be 2-D, got shape {packed.shape}")
        rows = packed.shape[0]
        cols = packed.shape[1] * 32 // bits
        groups = (rows, cols // group_size)
        if packed.dtype != np.uint32 or scales.shape != groups or biases.shape != groups:
            raise WeightError(f"affine weight of {bits} bits, group {group_size}: packed "
                              f"{packed.dtype}{packed.shape} does not fit scales {scales.shape} "
                              f"and biases {biases.shape}")
        self.packed, self.group_size, self.bits = packed, group_size, bits
        self.scales = np.asarray(scales, dtype=np.float32)
        self.biases = np.asarray(biases, dtype=np.float32)
        self.shape = (rows, cols)

    def __repr__(self) -> str:
        return (f"AffineQuantizedTensor(shape={self.shape}, bits={self.bits}, "
                f"group_size={self.group_size})")

    def levels(self) -> np.ndarray:
        """The unsigned integers q, uint8 [N, K]."""
        per_word = 32 // self.bits
        shifts = np.arange(per_word, dtype=np.uint32) * self.bits
        values = (self.packed[..., None] >> shifts) & ((1 << self.bits) - 1)
        return values.reshape(self.shape).astype(np.uint8)

    def dequantize(self) -> np.ndarray:
        return self._values(self.packed, self.scales, self.biases)

    def _values(self, packed: np.ndarray, scales: np.ndarray, biases: np.ndarray) -> np.ndarray:
        rows, cols = packed.shape[0], self.shape[1]
        per_word = 32 // self.bits
        shifts = np.arange(per_word, dtype=np.uint32) * self.bits
        levels = ((packed[..., None] >> shifts) & ((1 << self.bits) - 1)).reshape(rows, cols)
        grouped = levels.reshape(rows, cols // self.group_size, self.group_size)
        values = grouped.astype(np.float32) * scales[..., None] + biases[..., None]
        return values.reshape(rows, cols)

    def take_rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids), K]: the rows `ids`, dequantizing only those."""
        return self._values(self.packed[ids], self.scales[ids], self.biases[ids])

    def digest_parts(self) -> Iterator[Any]:
        yield repr(("affine", self.bits, self.group_size, self.shape)).encode()
        for part in (self.packed, self.scales, self.biases):
            yield memoryview(np.ascontiguousarray(part)).cast("B")

    def stack_rows(self, others: Sequence[Any]) -> Any:
        parts = [self, *others]
        if all(isinstance(p, AffineQuantizedTensor) and (p.bits, p.group_size, p.shape[1]) ==
               (self.bits, self.group_size, self.shape[1]) for p in parts):
            return AffineQuantizedTensor(np.concatenate([p.packed for p in parts]),
                                         np.concatenate([p.scales for p in parts]),
                                         np.concatenate([p.biases for p in parts]),
                                         self.group_size, self.bits)
        return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts], axis=0)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        dense = self.dequantize()
        return dense if dtype is None else dense.astype(dtype)


class StackedWeight:
    """Matrices [N_i, K] of different formats stacked along N (q, k and v stored as q5_0, q5_0
    and q8_0, say): `parts` in order, each in its own format; as an array, their float32
    values concatenated."""

    def __init__(self, parts: Sequence[Any]) -> None:
        depths = {tuple(part.shape)[1] for part in parts}
        if len(depths) != 1:
            raise WeightError(f"stacked matrices must share K, got shapes "
                              f"{[tuple(part.shape) for part in parts]}")
        self.parts = list(parts)
        self.shape = (sum(tuple(part.shape)[0] for part in parts), depths.pop())

    def __repr__(self) -> str:
        return f"StackedWeight({self.parts!r})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        dense = np.concatenate([np.asarray(p, dtype=np.float32) for p in self.parts], axis=0)
        return dense if dtype is None else dense.astype(dtype)


def _format_of(weight: Any) -> str:
    return weight.format if isinstance(weight, QuantizedTensor) else "f32"


def stack_rows(parts: Sequence[Any]) -> Any:
    """Weight matrices [N_i, K] stacked along N: one matrix where they share a format (blocks
    concatenated as stored), else a StackedWeight of the runs that do."""
    if any(isinstance(p, AffineQuantizedTensor) for p in parts):  # MLX layouts: one of them
        first = parts[0]
        return first.stack_rows(parts[1:]) if isinstance(first, AffineQuantizedTensor) \
            else _dense_stack(parts)
    runs: list[list[Any]] = []
    for part in parts:
        if runs and _format_of(runs[-1][-1]) == _format_of(part):
            runs[-1].append(part)
        else:
            runs.append([part])
    stacked = [_stack_one_format(run) for run in runs]
    return stacked[0] if len(stacked) == 1 else StackedWeight(stacked)


def _stack_one_format(parts: list[Any]) -> Any:
    if isinstance(parts[0], QuantizedTensor):
        if len(parts) == 1:
            return parts[0]
        data = np.concatenate([p.data for p in parts], axis=0)
        return QuantizedTensor(parts[0].format, data, (data.shape[0], parts[0].shape[1]))
    return _dense_stack(parts)


def _dense_stack(parts: Sequence[Any]) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts], axis=0)


def _halves(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 field at byte `offset` of every block, as float32 [..., blocks]."""
    return blocks[..., offset:offset + 2].copy().view(np.float16).astype(np.float32)[..., 0]


def _pack_levels(levels: np.ndarray, bits: int) -> np.ndarray:
    rows = levels.shape[0]
    per_word = 32 // bits
    words = levels.reshape(rows, -1, per_word).astype(np.uint32)
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    return np.bitwise_or.reduce(words << shifts, axis=-1).astype(np.uint32)


def _affine_q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # d * q == d * (q + 128) - 128 d exactly: both sides are small integers times a half.
    scale = _halves(blocks, 0)
    levels = (blocks[..., 2:].copy().view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return levels, scale, -128.0 * scale


def _affine_q4(blocks: np.ndarray, minimum: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    scale = _halves(blocks, 0)
    packed = blocks[..., 4:] if minimum else blocks[..., 2:]
    levels = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
    bias = _halves(blocks, 2) if minimum else -8.0 * scale
    return levels, scale, bias


_AFFINE_LEVELS: dict[str, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]] = {
    "q8_0": _affine_q8_0,
    "q4_0": lambda blocks: _affine_q4(blocks, minimum=False),
    "q4_1": lambda blocks: _affine_q4(blocks, minimum=True),
}


def affine_from_blocks(weight: QuantizedTensor) -> AffineQuantizedTensor:
    """The same matrix in MLX's affine layout (group 32), value for value; only formats whose
    row has `affine_bits` map (q4_1 is w = d q + m, q4_0 is d q - 8 d, q8_0 is
    d (q + 128) - 128 d with q shifted to unsigned)."""
    row = weight.row
    if row.affine_bits is None:
        raise WeightError(f"{weight.format} has no lossless affine form")
    rows, cols = weight.shape
    blocks = weight.data.reshape(rows, cols // row.block_size, row.block_bytes)
    levels, scale, bias = _AFFINE_LEVELS[weight.format](blocks)
    return AffineQuantizedTensor(_pack_levels(levels.reshape(rows, cols), row.affine_bits),
                                 scale, bias, row.block_size, row.affine_bits)
