"""Block-scaled FP8 safetensors checkpoints (DeepSeek-V3 and R1 as published, and others in
that format): `float8_e4m3fn` weights with a float32 `weight_scale_inv` of one scale per block.

Invariant: each such weight reaches the model with every element equal to
float32(e4m3fn code) * float32(its block's scale) rounded once to nearest-even: one float32
multiply per weight, the product transformers' FP8 dequantization computes before casting to
the model's dtype. With keep_quantized, a matrix whose columns and column blocks are multiples
of 32 stays in its codes, as a QuantizedTensor of format fp8_e4m3 (formats/fp8_e4m3.py: each
block of 32 weights of a row with the float32 scale of the checkpoint block it lies in), whose
values are those same products; every other fp8 weight is float32. The e4m3fn codes are
decoded by bit arithmetic, exactly (every code is a float32). Blocks at the right and bottom
edges cover what is left of a dimension that is not a multiple of the block size. Refused with
the file and tensor named when the checkpoint is opened: an fp8 weight with fewer than two
dimensions, without its scale or with a scale of the wrong shape or of a dtype other than F32,
BF16 or F16 (each widens to float32 exactly), a scale without an fp8 weight, and any other
float8 kind. A weight that holds the NaN code (0x7F, 0xFF), or whose scale is not finite, is
refused when it is read, with the position named, whichever form it is read in.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from exactdraft.errors import CheckpointError, WeightError
from exactdraft.formats.fp8_e4m3 import (
    BLOCK_WEIGHTS,
    E4M3FN_VALUES,
    NAN_CODES,
    e4m3fn_values,
    pack_fp8_e4m3,
)
from exactdraft.formats.table import QuantizedTensor
from exactdraft.loading.safetensors_file import FLOAT8_DTYPES

__all__ = ["FP8BlockTensors", "block_scale_shape", "dequantize_blocks", "e4m3fn_values",
           "fp8_block_settings", "fp8_e4m3_matrix", "holds_in_blocks"]

SCALE_SUFFIX = "_scale_inv"  # weight -> weight_scale_inv
_E4M3 = "F8_E4M3"
_SCALE_DTYPES = ("F32", "BF16", "F16")  # each widens to float32 exactly


def fp8_block_settings(raw_config: Mapping[str, Any],
                       source: str = "config.json") -> tuple[int, int] | None:
    """The (rows, columns) block of a config.json's `quantization_config` with
    `quant_method` "fp8", or None for any other checkpoint."""
    settings = raw_config.get("quantization_config")
    if not isinstance(settings, Mapping) or settings.get("quant_method") != "fp8":
        return None
    block = settings.get("weight_block_size")
    if (not isinstance(block, list) or len(block) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in block)):
        raise CheckpointError(f"{source}: quantization_config weight_block_size must be two "
                              f"positive integers (fp8 with one scale per block), got {block!r}")
    scheme = settings.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise CheckpointError(f"{source}: quantization_config activation_scheme {scheme!r} is "
                              "not read (dynamic)")
    fmt = settings.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise CheckpointError(f"{source}: quantization_config fmt {fmt!r} is not read (e4m3)")
    return block[0], block[1]


def dequantize_blocks(codes: np.ndarray, scales: np.ndarray, block: tuple[int, int],
                      name: str = "weight") -> np.ndarray:
    """float32 values of e4m3fn `codes` (uint8, ...xRxC) times their block's float32 scale
    (...xceil(R/rows)xceil(C/columns)), one float32 multiply per element."""
    codes, scales = _checked_blocks(codes, scales, block, name)
    rows, columns = codes.shape[-2:]
    # Indexed, not repeated: a checkpoint's block sizes may be far larger than its weights.
    per_element = scales[..., np.arange(rows) // block[0], :][..., np.arange(columns) // block[1]]
    return E4M3FN_VALUES[codes] * per_element


def holds_in_blocks(shape: tuple[int, ...], block: tuple[int, int]) -> bool:
    """Whether a weight of `shape` stays in its codes as fp8_e4m3: a matrix whose columns and
    column blocks are multiples of 32, so that each block of 32 weights of a row lies inside
    one checkpoint block."""
    return len(shape) == 2 and shape[1] % BLOCK_WEIGHTS == 0 and block[1] % BLOCK_WEIGHTS == 0


def fp8_e4m3_matrix(codes: np.ndarray, scales: np.ndarray, block: tuple[int, int],
                    name: str = "weight") -> QuantizedTensor:
    """The fp8_e4m3 QuantizedTensor of e4m3fn `codes` (uint8 RxC, C and block[1] multiples of
    32) and their block scales (ceil(R/rows)xceil(C/columns)): element for element the values
    dequantize_blocks gives, refused alike (NaN code, non-finite scale, wrong scale shape)."""
    codes, scales = _checked_blocks(codes, scales, block, name)
    if not holds_in_blocks(codes.shape, block):
        raise WeightError(f"tensor {name!r} of shape {tuple(codes.shape)} with blocks of "
                          f"{block[0]}x{block[1]} does not fit fp8_e4m3 (a matrix whose "
                          f"columns and column blocks are multiples of {BLOCK_WEIGHTS})")
    rows, columns = codes.shape
    blocks = columns // BLOCK_WEIGHTS
    first_columns = np.arange(blocks) * BLOCK_WEIGHTS
    per_block = scales[np.arange(rows) // block[0]][:, first_columns // block[1]]
    return QuantizedTensor("fp8_e4m3", pack_fp8_e4m3(codes, per_block), (rows, columns))


def _checked_blocks(codes: np.ndarray, scales: np.ndarray, block: tuple[int, int],
                    name: str) -> tuple[np.ndarray, np.ndarray]:
    """codes and float32 scales, or a WeightError naming the tensor: the scale grid must fit,
    no code may be NaN and every scale must be finite."""
    codes = np.asarray(codes)
    scales = np.asarray(scales, dtype=np.float32)
    expected = block_scale_shape(codes.shape, block)
    if expected is None:
        raise WeightError(f"tensor {name!r} of shape {tuple(codes.shape)} has fewer than two "
                          "dimensions; block scales cover matrices")
    if tuple(scales.shape) != expected:
        raise WeightError(f"tensor {name!r} of shape {tuple(codes.shape)} needs a scale of "
                          f"shape {expected} for blocks of {block[0]}x{block[1]}, got "
                          f"{tuple(scales.shape)}")
    nan = np.isin(codes, NAN_CODES)
    if nan.any():
        where = tuple(int(i) for i in np.argwhere(nan)[0])
        raise WeightError(f"tensor {name!r} holds the fp8 NaN code at {where}")
    if not np.isfinite(scales).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(scales))[0])
        raise WeightError(f"tensor {name + SCALE_SUFFIX!r} holds {scales[where]} at {where}")
    return codes, scales


def block_scale_shape(shape: tuple[int, ...],
                      block: tuple[int, int]) -> tuple[int, ...] | None:
    """The scale grid of a weight of `shape`: one scale per block of its last two dimensions;
    None for a weight of fewer than two dimensions, which no block scale fits."""
    if len(shape) < 2:
        return None
    rows, columns = shape[-2:]
    return (*shape[:-2], -(-rows // block[0]), -(-columns // block[1]))


class FP8BlockTensors(Mapping):
    """A view of a safetensors mapping in which each fp8 weight is float32, or with
    keep_quantized an fp8_e4m3 QuantizedTensor where it fits (holds_in_blocks), and its
    `weight_scale_inv` is gone."""

    def __init__(self, tensors: Any, block: tuple[int, int], keep_quantized: bool = False) -> None:
        self.tensors, self.block, self.keep_quantized = tensors, block, keep_quantized
        entries = tensors.entries
        self.scaled: set[str] = set()
        for name, entry in entries.items():
            where = f"{entry.path}: tensor {name!r}"
            if name.endswith(SCALE_SUFFIX):
                weight = entries.get(name[: -len(SCALE_SUFFIX)])
                self._check_scale(name, entry, weight, where)
                self.scaled.add(name[: -len(SCALE_SUFFIX)])
            elif entry.dtype == _E4M3 and name + SCALE_SUFFIX not in entries:
                raise WeightError(f"{entry.path}: fp8 tensor {name!r} has no "
                                  f"{name + SCALE_SUFFIX!r}")
            elif entry.dtype in FLOAT8_DTYPES and entry.dtype != _E4M3:
                raise WeightError(f"{where} is stored as {entry.dtype}, which is not read "
                                  "(float8 weights are read as F8_E4M3 with block scales)")

    def _check_scale(self, name: str, entry: Any, weight: Any, where: str) -> None:
        """Refuses a scale that does not fit the fp8 weight it is named after."""
        scaled = name[: -len(SCALE_SUFFIX)]
        if weight is None or weight.dtype != _E4M3:
            raise WeightError(f"{where} scales {scaled!r}, which is "
                              f"{'missing' if weight is None else weight.dtype}, not F8_E4M3")
        if entry.dtype not in _SCALE_DTYPES:
            raise WeightError(f"{where} is stored as {entry.dtype}; a block scale is one of "
                              f"{', '.join(_SCALE_DTYPES)}")
        expected = block_scale_shape(tuple(weight.shape), self.block)
        if expected is None:
            raise WeightError(f"{weight.path}: fp8 tensor {scaled!r} of shape "
                              f"{tuple(weight.shape)} has fewer than two dimensions; block "
                              "scales cover matrices")
        if tuple(entry.shape) != expected:
            raise WeightError(
                f"{where} has shape {tuple(entry.shape)}; {scaled!r} of shape "
                f"{tuple(weight.shape)} needs {expected} for blocks of "
                f"{self.block[0]}x{self.block[1]}")

    def __getitem__(self, name: str) -> Any:
        if name not in self.scaled:
            if name.endswith(SCALE_SUFFIX) and name[: -len(SCALE_SUFFIX)] in self.scaled:
                raise KeyError(name)
            return self.tensors[name]
        read = fp8_e4m3_matrix if self.keep_quantized and holds_in_blocks(
            self.shape(name), self.block) else dequantize_blocks
        try:
            return read(self.tensors.stored(name), self.tensors[name + SCALE_SUFFIX], self.block,
                        name)
        except WeightError as error:
            raise WeightError(f"{self.tensors.entries[name].path}: {error}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensors.shape(name))

    def __iter__(self) -> Iterator[str]:
        return (name for name in self.tensors if not (
            name.endswith(SCALE_SUFFIX) and name[: -len(SCALE_SUFFIX)] in self.scaled))

    def __len__(self) -> int:
        return sum(1 for _ in self)
