"""A backend that splits every weight matrix across tensor-parallel ranks by whole output
columns and gathers the columns, wrapped around the C-kernel CPU backend.

Invariant: TP=N writes the bits TP=1 writes. `matrix` keeps this rank's contiguous range of
output columns (sharding.column_ranges), taken from the weight before it is read (a matrix
too narrow to give every rank a group of columns stays whole on every rank); `linear`
computes those columns with the wrapped backend's kernel, each element a whole dot product in
the K order TP=1 uses, then gathers every rank's columns in rank order: a copy, never a sum.
Attention (whole heads: every head from the gathered q, k and v, or with heads.py each rank
its own heads; attention_heads.py for the hybrids), the recurrent layers (every head, or with
recurrent_heads.py each rank its own heads), the experts' weighted sum (experts.py), norms,
rope, the activations and the residual adds run with the wrapped backend's canonical
arithmetic, so every rank holds the bits TP=1 holds after every op (for its heads, when they
are split). The model runs its per-op layer body (fused_layers is False), whose bits equal
the fused path's (tests/backends).
"""

from __future__ import annotations

from typing import Any

from exactdraft.errors import BackendError
from exactdraft.parallel.group import ParallelGroup
from exactdraft.parallel.sharding import COLUMN_ALIGN, column_ranges, weight_rows


class ColumnShard:
    """This rank's output columns [start, end) of a weight with `columns` outputs, packed by
    the wrapped backend, and the widths every rank computes."""

    def __init__(self, local: Any, columns: int, depth: int, ranges: list[tuple[int, int]],
                 rank: int) -> None:
        self.local = local
        self.shape = (columns, depth)
        self.start, self.end = ranges[rank]
        self.widths = [end - start for start, end in ranges]
        self.replicated = self.widths[rank] == columns and len(ranges) > 1
        self._bias: tuple[Any, Any] | None = None  # (full bias, its local columns)

    def local_bias(self, bias: Any | None) -> Any | None:
        if bias is None:
            return None
        if self._bias is None or self._bias[0] is not bias:
            self._bias = (bias, bias[self.start:self.end].contiguous())
        return self._bias[1]


class GatheringBackend:
    """The wrapped backend with column-split matrices (see the module docstring)."""

    fused_layers = False

    def __init__(self, inner: Any, group: ParallelGroup) -> None:
        from exactdraft.backends.torch_cpu import TorchCPUBackend

        if not isinstance(inner, TorchCPUBackend):
            raise BackendError(f"tensor parallel runs on the C-kernel CPU backend ('torch' with "
                               f"the kernels built), not {inner!r}: only its matmul gives an "
                               "output column the same bits whatever columns share the call")
        self.inner = inner
        self.group = group
        self.matrix_bytes = 0  # packed weight bytes this rank holds

    def __repr__(self) -> str:
        return (f"GatheringBackend({self.inner!r}, rank {self.group.rank} of "
                f"{self.group.world_size})")

    def __getattr__(self, name: str) -> Any:
        if name in ("plan_layer", "run_layer", "run_layers"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def matrix(self, weight: Any) -> ColumnShard:
        columns, depth = (int(size) for size in weight.shape)
        if -(-columns // COLUMN_ALIGN) < self.group.world_size:
            # Too narrow to give every rank a group (a router, say): every rank computes
            # every column, no gather; still whole dot products.
            ranges = [(0, columns)] * self.group.world_size
        else:
            ranges = column_ranges(columns, self.group.world_size)
        start, end = ranges[self.group.rank]
        local = self.inner.matrix(weight_rows(weight, start, end))
        self.matrix_bytes += _packed_bytes(local)
        return ColumnShard(local, columns, depth, ranges, self.group.rank)

    def local_matrix(self, weight: Any) -> Any:
        """A matrix this rank computes whole for itself, gathering nothing (heads.py)."""
        from exactdraft.parallel.heads import LocalColumns

        local = LocalColumns(self.inner.matrix(weight))
        self.matrix_bytes += _packed_bytes(local.local)
        return local

    def forget(self, shard: Any) -> None:
        """A matrix the model replaced before using it: its bytes are no longer held."""
        self.matrix_bytes -= _packed_bytes(getattr(shard, "local", shard))

    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        from exactdraft.parallel.heads import GatheredInput, LocalColumns

        if type(weight) is LocalColumns:
            return self.inner.linear(x, weight.local, bias)
        if type(weight) is GatheredInput:
            x = self.group.all_gather_columns(x.contiguous(), weight.input_widths)
            weight = weight.shard
        local = self.inner.linear(x, weight.local, weight.local_bias(bias))
        if weight.replicated:
            return local
        return self.group.all_gather_columns(local, weight.widths)


def _packed_bytes(matrix: Any) -> int:
    parts = getattr(matrix, "packed", [matrix])  # C-kernel matrices keep their parts there
    return sum(_nbytes(getattr(part, "data", part)) for part in parts)


def _nbytes(data: Any) -> int:
    return int(data.nbytes) if hasattr(data, "nbytes") else data.numel() * data.element_size()
