"""The splits TP must not use, kept for the negative controls: a row-parallel down projection
(or a split recurrent layer's out projection) whose ranks multiply their slices of K and
all-reduce the partial sums, and whole experts per rank whose weighted outputs each rank adds
up before the ranks all-reduce the partial sums."""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft.models.moe import route
from exactdraft.parallel.backend import GatheringBackend
from exactdraft.parallel.experts import ExpertParallelMoE
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


class RowParallelHeadsBackend(GatheringBackend):
    """GatheringBackend whose split recurrent layers' out projections (split_out_projections)
    take this rank's heads' rows as they are, multiply them by the matching slice of K and
    all-reduce the partial sums, instead of gathering the heads first."""

    def split_out_projections(self, model: Any, tensors: Any) -> int:
        from exactdraft.parallel.heads import GatheredInput

        count = 0
        for index, layer in enumerate(model.layers):
            mixer = layer.mixer
            if not hasattr(mixer, "empty_state") or type(mixer.out_proj) is not GatheredInput:
                continue
            name = next(key for key in tensors if key.endswith("out_proj.weight") and
                        f"layers.{index}." in key)
            width = mixer.out_proj.input_widths[self.group.rank]
            start = width * self.group.rank
            dense = np.ascontiguousarray(
                np.asarray(tensors[name], dtype=np.float32)[:, start:start + width])
            mixer.out_proj = ("row parallel", self.inner.matrix(dense), 0, width)
            count += 1
        return count

    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        if not isinstance(weight, tuple):
            return super().linear(x, weight, bias)
        import torch.distributed as dist

        partial = self.inner.linear(x.contiguous(), weight[1])
        dist.all_reduce(partial, group=self.group.group)
        return partial if bias is None else partial + bias


class SummedExpertsMoE(ExpertParallelMoE):
    """ExpertParallelMoE (no shared expert, no latent projections) whose ranks each add up
    their own experts' weighted outputs and all-reduce the partial sums."""

    def run(self, be: Any, x: Any, ctx: Any = None) -> Any:
        import torch
        import torch.distributed as dist

        assert self.shared_down is None and self.latent_in is None
        experts = self.settings.num_experts
        host = be.to_host(be.linear(x, self.entry))
        chosen, weights = route(self.settings, host[:, :experts], self.correction_bias)
        rows_in = be.to_host(x)
        start, end = self.ranges[self.group.rank]
        partial = np.zeros(rows_in.shape, dtype=np.float32)
        for expert in np.unique(chosen):
            if not start <= expert < end:
                continue
            rows, slots = np.nonzero(chosen == expert)
            out = be.to_host(self.experts[int(expert)].run(be, be.vector(rows_in[rows])))
            partial[rows] = partial[rows] + out * weights[rows, slots][:, None]
        summed = torch.from_numpy(partial)
        dist.all_reduce(summed, group=self.group.group)
        return be.vector(summed.numpy())
