"""How a model family's weights split across tensor-parallel ranks, as the family declares it.

Invariant: the parallel layer learns everything family-specific about a split from this
declaration (which layers split by heads, where a layer's weights live, how to load them again
as stored), so it names no family; a family that declares nothing is not split, and is refused
before any rank joins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exactdraft.models.tensors import TensorReader


@dataclass(frozen=True)
class TensorParallelSplit:
    """What a family says of its split. Every matrix not named here splits by output columns.

    - `heads`: a dense transformer's TensorNames: its attention splits by heads (each rank its
      KV heads and their query heads) where the ranks divide the KV heads;
    - `experts(backend, reader, config, layer, count)`: layer `layer`'s `count` experts loaded
      with the family's own loader on `backend`: each rank then holds whole experts;
    - `attention(reader, layer)`: where a hybrid's attention layer `layer` lives (the prefix its
      weights share), to split it by heads;
    - `recurrent(backend, reader, config, layer, mixer)`: a hybrid's recurrent layer loaded
      again on `backend`, to split it by head groups.
    """

    heads: Any = None
    experts: Callable[[Any, TensorReader, Any, int, int], list[Any]] | None = None
    attention: Callable[[TensorReader, int], str] | None = None
    recurrent: Callable[[Any, TensorReader, Any, int, Any], Any] | None = None


def not_split(config: Any) -> TensorParallelSplit | None:
    """The declaration of a family with no tensor-parallel split."""
    return None
