"""Argument checks for the CPU kernels: what the C entry points may be handed.

Invariant: an array reaches a kernel only if its dtype, shape, contiguity and device are the
ones the C code reads, and an output never overlaps an input unless the kernel allows it in
place; arrays are used where they are, never copied.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def is_torch(array: Any) -> bool:
    return type(array) is not np.ndarray and hasattr(array, "data_ptr")


_NUMPY_DTYPES = {name: np.dtype(name) for name in ("float32", "uint8", "uint16", "int32",
                                                   "int64")}


def address_of(array: Any, name: str, dtype: str, shape: tuple[int | None, ...]) -> Any:
    """What the C module takes as a data pointer: the numpy array itself or a torch address."""
    if type(array) is np.ndarray:
        expected = _NUMPY_DTYPES[dtype]
        if array.dtype is not expected and array.dtype != expected:
            raise TypeError(f"{name} must have dtype {dtype}, got {array.dtype}")
        flags = array.flags
        if not flags.c_contiguous or not flags.aligned:
            raise ValueError(f"{name} must be C-contiguous and aligned")
        found = array.shape
        pointer = array
    elif is_torch(array):
        torch = sys.modules["torch"]
        if array.dtype is not getattr(torch, dtype):
            raise TypeError(f"{name} must have dtype torch.{dtype}, got {array.dtype}")
        if not array.is_cpu:
            raise ValueError(f"{name} must be on the CPU, got device {array.device}")
        if not array.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        found = tuple(array.shape)
        pointer = array.data_ptr()
    else:
        raise TypeError(f"{name} must be a numpy array or a torch tensor, got "
                        f"{type(array).__name__}")
    matches = len(found) == len(shape)
    if matches:
        for expected_size, size in zip(shape, found):
            if expected_size is not None and expected_size != size:
                matches = False
    if not matches:
        wanted = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
        raise ValueError(f"{name} must have shape {wanted}, got {list(found)}")
    return pointer


def span_of(array: Any) -> tuple[int, int]:
    if type(array) is np.ndarray:
        start = array.__array_interface__["data"][0]
        return start, start + array.nbytes
    start = array.data_ptr()
    return start, start + array.numel() * array.element_size()


def output_for(out: Any, like: Any, shape: tuple[int, ...], inputs: tuple[Any, ...],
            in_place_ok: Any = None) -> tuple[Any, Any]:
    """A float32 output of `shape` (new, or `out` checked) and its address."""
    if out is None:
        if is_torch(like):
            out = sys.modules["torch"].empty(shape, dtype=sys.modules["torch"].float32)
        else:
            out = np.empty(shape, dtype=np.float32)
        return out, address_of(out, "out", "float32", shape)
    address = address_of(out, "out", "float32", shape)
    if type(out) is np.ndarray and not out.flags.writeable:
        raise ValueError("out must be writeable")
    if out is not in_place_ok:
        low, high = span_of(out)
        for array in inputs:
            if array is None:
                continue
            other_low, other_high = span_of(array)
            if low < other_high and other_low < high:
                raise ValueError("out must not overlap the inputs")
    return out, address
