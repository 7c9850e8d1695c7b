"""A checkpoint's tensors as the families read them: shapes without reading, reads checked
against the config, and the digest of exactly the weights a model uses.

Invariant: every tensor a model is built from is checked by name and shape before it is used,
so a bad checkpoint fails at load with a WeightError naming the tensor; and the weights digest
covers the stored contents (blocks as stored, arrays as float32) of those tensors and no other,
in name order, whatever the order they were read in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from exactdraft.errors import WeightError


def tensor_shape(tensors: Mapping[str, Any], name: str) -> tuple[int, ...]:
    """The logical shape of a tensor, without reading its data when the source can tell."""
    shape_of = getattr(tensors, "shape", None)
    if callable(shape_of):
        return tuple(shape_of(name))
    value = tensors[name]
    return tuple(value.shape) if hasattr(value, "shape") else tuple(np.shape(value))


def check_shapes(expected: Mapping[str, tuple[int, ...]], shape_of: Any, source: str) -> None:
    """A WeightError naming the first tensor that is missing or has another shape."""
    for name, shape in expected.items():
        try:
            found = tuple(shape_of(name))
        except KeyError:
            raise WeightError(f"{source}: checkpoint is missing tensor {name!r}") from None
        if found != shape:
            raise WeightError(f"{source}: tensor {name!r} has shape {found}, expected {shape} "
                              "from the config")


def hash_tensor(digest: Any, value: Any) -> None:
    """Feed a tensor's stored contents (blocks as stored, arrays as float32) with its format
    and shape to a hashlib digest."""
    parts = getattr(value, "digest_parts", None)
    if parts is not None:
        for part in parts():
            digest.update(part)
        return
    array = np.ascontiguousarray(np.asarray(value, dtype=np.float32))
    digest.update(repr(("f32", array.shape)).encode())
    digest.update(memoryview(array).cast("B"))


def weights_digest(tensors: Mapping[str, Any], names: Iterable[str]) -> str:
    """sha256 hex of the named tensors, in name order (the module invariant)."""
    digest = hashlib.sha256()
    for name in sorted(names):
        digest.update(name.encode() + b"\0")
        hash_tensor(digest, tensors[name])
    return digest.hexdigest()


class TensorReader:
    """A checkpoint's tensors as a family reads them: every read checks the tensor exists and
    has the shape the config calls for (a WeightError naming it otherwise) and is remembered,
    so that the weights digest covers exactly the tensors the model uses."""

    def __init__(self, tensors: Mapping[str, Any], source: str) -> None:
        self.tensors = tensors
        self.source = source
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.tensors:
            raise WeightError(f"{self.source}: checkpoint is missing tensor {name!r}")
        return tensor_shape(self.tensors, name)

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> Any:
        """The tensor as stored (quantized weights stay quantized)."""
        found = self.shape(name)
        if shape is not None and found != tuple(shape):
            raise WeightError(f"{self.source}: tensor {name!r} has shape {found}, expected "
                              f"{tuple(shape)} from the config")
        self.used.add(name)
        return self.tensors[name]

    def array(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """The tensor as float32 numpy."""
        return np.ascontiguousarray(np.asarray(self.get(name, shape), dtype=np.float32))

    def digest(self) -> str:
        return weights_digest(self.tensors, self.used)
