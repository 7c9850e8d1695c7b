"""MLX-format quantized checkpoints: `weight` (packed uint32), `scales` and `biases` triples.

Invariant: every quantized matrix reaches the model as one AffineQuantizedTensor holding the
checkpoint's packed integers, scales and biases unchanged, under the plain `.weight` name the
model expects; nothing is dequantized here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from exactdraft.errors import CheckpointError
from exactdraft.formats.table import AffineQuantizedTensor


def quantization_settings(raw_config: dict[str, Any],
                          source: str = "config.json") -> dict[str, Any] | None:
    """{"group_size", "bits"} from an MLX config.json, or None for a dense checkpoint."""
    settings = raw_config.get("quantization") or raw_config.get("quantization_config")
    if not isinstance(settings, dict) or "bits" not in settings or "group_size" not in settings:
        return None
    mode = settings.get("mode", "affine")
    if mode != "affine":
        raise CheckpointError(f"{source}: quantization mode {mode!r} is not supported (affine)")
    for key in ("bits", "group_size"):
        if isinstance(settings[key], bool) or not isinstance(settings[key], int):
            raise CheckpointError(f"{source}: quantization {key} must be an integer, got "
                                  f"{settings[key]!r}")
    return {"group_size": settings["group_size"], "bits": settings["bits"]}


class AffineTensors(Mapping):
    """A view of a tensor mapping in which each weight/scales/biases triple is one tensor."""

    def __init__(self, tensors: Mapping[str, Any], group_size: int, bits: int) -> None:
        self.tensors, self.group_size, self.bits = tensors, group_size, bits
        self.quantized = {name[: -len(".scales")] for name in tensors
                          if name.endswith(".scales")}
        for prefix in self.quantized:
            for part in ("weight", "biases"):
                if f"{prefix}.{part}" not in tensors:
                    raise CheckpointError(f"quantized tensor {prefix!r} has scales but no {part}")

    def _prefix(self, name: str) -> str | None:
        prefix = name[: -len(".weight")] if name.endswith(".weight") else None
        return prefix if prefix in self.quantized else None

    def __getitem__(self, name: str) -> Any:
        prefix = self._prefix(name)
        if prefix is None:
            return self.tensors[name]
        return AffineQuantizedTensor(self.tensors[name], self.tensors[prefix + ".scales"],
                                     self.tensors[prefix + ".biases"], self.group_size,
                                     self.bits)

    def shape(self, name: str) -> tuple[int, ...]:
        prefix = self._prefix(name)
        shape = tuple(self.tensors.shape(name))
        return (shape[0], shape[1] * 32 // self.bits) if prefix else shape

    def __iter__(self) -> Iterator[str]:
        return (n for n in self.tensors if not n.endswith((".scales", ".biases"))
                or n.rsplit(".", 1)[0] not in self.quantized)

    def __len__(self) -> int:
        return sum(1 for _ in self)
