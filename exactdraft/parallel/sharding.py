"""Which output columns of a weight matrix each tensor-parallel rank computes, and that rank's
rows of the weight, taken before the weight is read.

Invariant: the split is by whole output columns (rows of the [N, K] weight) and never along K,
so every output element is one dot product over the full K, computed by one rank with the
arithmetic TP=1 uses for it (the C kernels fix an element's K order by K and the weight format
alone, whatever columns share the call). The ranks' ranges are contiguous, in rank order and
cover [0, N) exactly once, so gathering the ranks' outputs in rank order rebuilds the TP=1
output without a single add. Ranges start on multiples of COLUMN_ALIGN so each rank's part fills
whole groups of the packed layouts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft.errors import ParameterError
from exactdraft.formats.table import QuantizedTensor, StackedWeight
from exactdraft.parallel.settings import checked_world_size

# Rows per group of the dot layout (DOT_GROUP) and a multiple of the grouped layout's 4.
COLUMN_ALIGN = 16


def column_ranges(columns: int, world_size: int, align: int = COLUMN_ALIGN
                  ) -> list[tuple[int, int]]:
    """[start, end) of the output columns of each rank: contiguous, in rank order, starting on
    multiples of `align`, as even as that allows (the first ranks take the extra groups)."""
    checked_world_size(world_size, "tensor_parallel")
    groups = -(-columns // align)
    if groups < world_size:
        raise ParameterError(
            f"a weight with {columns} output columns cannot be split across tensor_parallel="
            f"{world_size} ranks in whole groups of {align} columns (at most {groups} ranks)")
    base, extra = divmod(groups, world_size)
    ranges, start = [], 0
    for rank in range(world_size):
        end = min(columns, start + (base + (rank < extra)) * align)
        ranges.append((start, end))
        start = end
    return ranges


def weight_rows(weight: Any, start: int, end: int) -> Any:
    """Rows [start, end) of a weight matrix [N, K], in its stored format; for weights read
    lazily from a file (memory-mapped), only those rows' bytes are read when they are packed."""
    if isinstance(weight, QuantizedTensor):
        return QuantizedTensor(weight.format, weight.data[start:end],
                               (end - start, weight.shape[1]))
    if isinstance(weight, StackedWeight):
        parts, first = [], 0
        for part in weight.parts:
            rows = tuple(part.shape)[0]
            low, high = max(start, first), min(end, first + rows)
            if low < high:
                parts.append(weight_rows(part, low - first, high - first))
            first += rows
        return parts[0] if len(parts) == 1 else StackedWeight(parts)
    if isinstance(weight, np.ndarray):
        if weight.ndim != 2:
            raise ParameterError(f"a weight matrix must be 2-D, got shape {weight.shape}")
        return weight[start:end]
    raise ParameterError(f"tensor parallel cannot split a weight of type "
                         f"{type(weight).__name__}; supported: float32 arrays, GGUF blocks and "
                         f"fp8_e4m3 blocks")
