"""Weight containers shared by the loaders and the model: shapes, checks and row stacking.

Invariant: a weight keeps the exact values the checkpoint stores. Stacking the rows of several
matrices (q, k and v into one matrix; gate and up into one) only concatenates output rows, so
each output element keeps the K order it would have alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


class WeightError(ValueError):
    """A tensor is missing, misshapen or in a format that cannot be used; the message names it."""


def weight_shape(tensors: Mapping[str, Any], name: str) -> tuple[int, ...]:
    """The logical shape of a tensor without reading its data when the source can tell."""
    shape_of = getattr(tensors, "shape", None)
    if callable(shape_of):
        return tuple(shape_of(name))
    value = tensors[name]
    return tuple(value.shape) if hasattr(value, "shape") else tuple(np.shape(value))


def stack_rows(parts: Sequence[Any]) -> Any:
    """Concatenate weight matrices [N_i, K] along N."""
    stackable = getattr(parts[0], "stack_rows", None)
    if stackable is not None:
        return stackable(parts[1:])
    return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts], axis=0)


# Bytes per block of 32 weights for the GGUF block formats kept quantized in memory.
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}
BLOCK_SIZE = 32


class QuantizedTensor:
    """A matrix [N, K] kept in a GGUF block format exactly as the file stores it.

    `data` is uint8 [N, K / 32 * block bytes]: each row is K / 32 consecutive blocks.
    - q8_0: float16 scale d, 32 int8 q; w = d * q
    - q4_0: float16 d, 16 bytes; byte i holds element i (low nibble) and i + 16 (high);
      w = d * (q - 8)
    - q4_1: float16 d, float16 m, 16 bytes as in q4_0; w = d * q + m
    """

    def __init__(self, format: str, data: np.ndarray, shape: tuple[int, int]) -> None:
        if format not in BLOCK_BYTES:
            raise WeightError(f"unknown block format {format!r}; known: {', '.join(BLOCK_BYTES)}")
        rows, cols = shape
        if cols % BLOCK_SIZE:
            raise WeightError(f"{format} needs K to be a multiple of {BLOCK_SIZE}, got {cols}")
        row_bytes = cols // BLOCK_SIZE * BLOCK_BYTES[format]
        if data.dtype != np.uint8 or data.shape != (rows, row_bytes):
            raise WeightError(f"{format} data for shape {shape} must be uint8 "
                              f"{(rows, row_bytes)}, got {data.dtype} {data.shape}")
        self.format = format
        self.data = data
        self.shape = (rows, cols)

    def __repr__(self) -> str:
        return f"QuantizedTensor({self.format!r}, shape={self.shape})"

    def stack_rows(self, others: Sequence[Any]) -> Any:
        parts = [self, *others]
        if all(isinstance(p, QuantizedTensor) and p.format == self.format
               and p.shape[1] == self.shape[1] for p in parts):
            data = np.concatenate([p.data for p in parts], axis=0)
            return QuantizedTensor(self.format, data, (data.shape[0], self.shape[1]))
        return np.concatenate([np.asarray(p, dtype=np.float32) for p in parts], axis=0)

    def dequantize(self) -> np.ndarray:
        """float32 [N, K], exact: every block value is representable in float32."""
        rows, cols = self.shape
        blocks = self.data.reshape(rows, cols // BLOCK_SIZE, BLOCK_BYTES[self.format])
        scale = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
        if self.format == "q8_0":
            values = blocks[..., 2:].copy().view(np.int8).astype(np.float32) * scale
        else:
            packed = blocks[..., 4:] if self.format == "q4_1" else blocks[..., 2:]
            nibbles = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).astype(np.float32)
            if self.format == "q4_0":
                values = (nibbles - 8.0) * scale
            else:
                low = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
                values = nibbles * scale + low
        return values.reshape(rows, cols)

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
        rows, cols = self.shape
        grouped = self.levels().reshape(rows, cols // self.group_size, self.group_size)
        values = grouped.astype(np.float32) * self.scales[..., None] + self.biases[..., None]
        return values.reshape(rows, cols)

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


def affine_from_blocks(weight: QuantizedTensor) -> AffineQuantizedTensor:
    """The same matrix in MLX's affine layout (group 32), losslessly: q4_1 is w = d*q + m,
    q4_0 is d*q - 8d and q8_0 is d*(q + 128) - 128d with q shifted to unsigned."""
    rows, cols = weight.shape
    blocks = weight.data.reshape(rows, cols // BLOCK_SIZE, BLOCK_BYTES[weight.format])
    scale = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)[..., 0]
    if weight.format == "q8_0":
        levels = (blocks[..., 2:].copy().view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        bias, bits = -128.0 * scale, 8
    else:
        packed = blocks[..., 4:] if weight.format == "q4_1" else blocks[..., 2:]
        levels = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
        if weight.format == "q4_1":
            bias = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)[..., 0]
        else:
            bias = -8.0 * scale
        bits = 4
    per_word = 32 // bits
    words = levels.reshape(rows, cols // per_word, per_word).astype(np.uint32)
    shifts = np.arange(per_word, dtype=np.uint32) * bits
    packed_words = np.bitwise_or.reduce(words << shifts, axis=-1).astype(np.uint32)
    return AffineQuantizedTensor(packed_words, scale, bias, BLOCK_SIZE, bits)
