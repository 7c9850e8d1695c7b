"""The split TP must not use, kept for the negative control: a row-parallel down projection
whose ranks multiply their slices of K and all-reduce the partial sums."""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft.parallel.backend import GatheringBackend
from exactdraft.parallel.sharding import column_ranges


class RowParallelDownBackend(GatheringBackend):
    """GatheringBackend, except that matrices of depth `down_depth` (the MLP down projection)
    are split along K and their partial products summed across ranks."""

    def __init__(self, inner: Any, group: Any, down_depth: int) -> None:
        super().__init__(inner, group)
        self.down_depth = down_depth

    def matrix(self, weight: Any) -> Any:
        if int(weight.shape[1]) != self.down_depth:
            return super().matrix(weight)
        start, end = column_ranges(self.down_depth, self.group.world_size,
                                   align=32)[self.group.rank]
        dense = np.ascontiguousarray(np.asarray(weight, dtype=np.float32)[:, start:end])
        return ("row parallel", self.inner.matrix(dense), start, end)

    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        if not isinstance(weight, tuple):
            return super().linear(x, weight, bias)
        import torch.distributed as dist

        _, local, start, end = weight
        partial = self.inner.linear(x[:, start:end].contiguous(), local)
        dist.all_reduce(partial, group=self.group.group)
        return partial if bias is None else partial + bias
