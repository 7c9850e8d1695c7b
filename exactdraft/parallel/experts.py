"""Mixture-of-experts layers with whole experts per tensor-parallel rank (expert parallel):
rank r holds experts [r E/N, (r+1) E/N) whole, runs them on the rows routed to them, and the
ranks gather the experts' output rows; every rank then adds them up in TP=1's order.

Invariant: TP=N writes the bits TP=1 writes. Routing runs on every rank from the same gathered
router logits (models/moe.py's `route`), so every rank picks the same experts and knows how
many rows each one gets. An expert's output rows are computed by its one rank with the wrapped
backend on the expert's whole matrices (each element a whole dot product, the K order fixed by
K and the format alone: backend.py), so they are TP=1's; the gather is a copy. The weighted sum
is models/moe.py's own code (MoEBlock.run; this class replaces only `expert_outputs`): starting
from zero, each row adds its experts' outputs times their float32 weights in increasing expert
index, then the shared expert last. The router and
shared-expert rows, the shared expert's down projection and the latent projections stay
column-split (backend.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.models.mixers import DenseMLP
from exactdraft.models.moe import MoEBlock
from exactdraft.models.recurrent import F32


def expert_ranges(experts: int, world_size: int) -> list[tuple[int, int]]:
    """[start, end) of the experts each rank holds: contiguous, in rank order."""
    return [(r * experts // world_size, (r + 1) * experts // world_size)
            for r in range(world_size)]


@dataclass
class ExpertParallelMoE(MoEBlock):
    """A MoEBlock whose `experts` holds this rank's experts whole (others None)."""

    ranges: list[tuple[int, int]] = None  # type: ignore[assignment]
    group: Any = None

    def expert_outputs(self, be: Any, rows_in: np.ndarray,
                       chosen: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, Any]]:
        """MoEBlock's expert outputs, in its order: this rank's experts run on their rows, then
        every rank's output rows, gathered in expert order (a copy)."""
        routed_experts = [int(e) for e in np.unique(chosen)]
        routed_rows = {e: np.nonzero(chosen == e) for e in routed_experts}
        start, end = self.ranges[self.group.rank]
        mine = [be.to_host(self.experts[e].run(be, be.vector(rows_in[routed_rows[e][0]])))
                for e in routed_experts if start <= e < end]
        local = np.concatenate(mine) if mine else np.zeros((0, rows_in.shape[1]), F32)
        counts = [sum(routed_rows[e][0].size for e in routed_experts if a <= e < b)
                  for a, b in self.ranges]
        gathered = self.group.all_gather_rows(local, counts)
        first = 0
        for expert in routed_experts:
            rows, slots = routed_rows[expert]
            yield rows, slots, gathered[first:first + rows.size]
            first += rows.size


def place_experts(model: Any, checkpoint: Any, backend: Any, stored_experts: Any) -> int:
    """Replace, in place, every MoEBlock of a DecoderModel on a GatheringBackend with an
    ExpertParallelMoE holding this rank's experts whole, loaded again as the checkpoint stores
    them by the family's `stored_experts` (models/split.py); returns how many were replaced
    (none when there are fewer experts than ranks: those keep their experts column-split)."""
    from exactdraft.models.tensors import TensorReader
    from exactdraft.parallel.recurrent_heads import Unpacked

    rank, world_size = backend.group.rank, backend.group.world_size
    reader = TensorReader(checkpoint.tensors, checkpoint.config.source)
    placed = 0
    for index, layer in enumerate(model.layers):
        block = layer.feed_forward
        if type(block) is not MoEBlock or block.settings.num_experts < world_size:
            continue
        ranges = expert_ranges(block.settings.num_experts, world_size)
        start, end = ranges[rank]
        stored = stored_experts(Unpacked(), reader, checkpoint.config, index,
                                block.settings.num_experts)
        held: list[Any] = []
        for e, expert in enumerate(block.experts):
            backend.forget(expert.gate_up)
            backend.forget(expert.down)
            held.append(DenseMLP(backend.local_matrix(stored[e].gate_up),
                                 backend.local_matrix(stored[e].down), expert.activation)
                        if start <= e < end else None)
        fields = {name: getattr(block, name) for name in block.__dataclass_fields__}
        layer.feed_forward = ExpertParallelMoE(**{**fields, "experts": held}, ranges=ranges,
                                               group=backend.group)
        placed += 1
    return placed
