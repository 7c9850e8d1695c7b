"""Attention split by heads across tensor-parallel ranks: each rank computes q, k and v of its
own heads, attends with them over its own part of the KV cache, and the ranks gather the
attention output (whole heads, in head order) before the output projection.

Invariant: TP=N writes the bits TP=1 writes. Rank r owns KV heads [r Hkv/N, (r+1) Hkv/N) and
the query heads that read them (grouped-query attention keeps a KV head's query heads
contiguous), so a head's q, k, v columns are whole dot products (sharding.py's rule), its
norm, rope and attention read that head alone with the kernels TP=1 runs, and the gather is a
copy. Used when N divides the KV heads; otherwise every rank attends with every head
(backend.py). A rank holds 1/N of the KV cache; export_kv gathers the heads on every rank and
import_kv keeps each rank's own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.formats.table import stack_rows
from exactdraft.models.decoder import DecoderModel, Trunk, check_max_context
from exactdraft.models.state import SequenceState
from exactdraft.models.transformer import transformer_trunk
from exactdraft.parallel.sharding import weight_rows


@dataclass(frozen=True)
class HeadRange:
    """The heads rank `rank` of `world_size` owns."""

    rank: int
    world_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def heads(self) -> int:
        return self.num_heads // self.world_size

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads // self.world_size

    def q_rows(self) -> tuple[int, int]:
        size = self.heads * self.head_dim
        return self.rank * size, (self.rank + 1) * size

    def kv_rows(self) -> tuple[int, int]:
        size = self.kv_heads * self.head_dim
        return self.rank * size, (self.rank + 1) * size


def splits_heads(config: Any, world_size: int) -> bool:
    """Whether the model's attention can be split by heads across world_size ranks."""
    return world_size > 1 and config.num_kv_heads % world_size == 0 and \
        config.num_heads % config.num_kv_heads == 0


class LocalColumns:
    """A matrix whose columns each rank computes for itself, gathering nothing (its heads' q, k
    and v, packed by the wrapped backend)."""

    def __init__(self, local: Any) -> None:
        self.local = local
        self.shape = local.shape


class GatheredInput:
    """A column-split matrix whose input arrives split by columns across the ranks (the
    attention output, by heads): the ranks gather the input before multiplying."""

    def __init__(self, shard: Any, input_widths: list[int]) -> None:
        self.shard = shard
        self.input_widths = input_widths
        self.shape = shard.shape


def head_split_trunk(config: Any, tensors: Mapping[str, Any], backend: Any, names: Any,
                     heads: HeadRange) -> Trunk:
    """The family's transformer trunk (models/transformer.py) on a GatheringBackend, each
    attention mixer keeping this rank's heads: its q, k and v rows computed locally, its output
    projection gathering the heads' attended rows first, and a KV cache of its KV heads."""
    trunk = transformer_trunk(config, tensors, backend, names)
    be, h = backend, heads
    (q0, q1), (k0, k1) = h.q_rows(), h.kv_rows()
    widths = [h.heads * h.head_dim] * h.world_size
    layers = []
    for index, layer in enumerate(trunk.layers):
        attention = layer.mixer
        be.forget(attention.qkv)  # replaced by this rank's heads below
        ranges = ((names.q, q0, q1), (names.k, k0, k1), (names.v, k0, k1))
        qkv = stack_rows([weight_rows(tensors[template.format(i=index) + ".weight"], a, b)
                          for template, a, b in ranges])
        bias = attention.qkv_bias
        if bias is not None:
            bias = be.vector(np.concatenate([
                np.asarray(tensors[template.format(i=index) + ".bias"], np.float32)[a:b]
                for template, a, b in ranges]))
        mixer = dataclasses.replace(attention, qkv=be.local_matrix(qkv), qkv_bias=bias,
                                    output=GatheredInput(attention.output, widths),
                                    num_heads=h.heads, num_kv_heads=h.kv_heads)
        layers.append(dataclasses.replace(layer, mixer=mixer))
    return dataclasses.replace(trunk, layers=layers, num_kv_heads=h.kv_heads)


class HeadSplitDecoderModel(DecoderModel):
    """DecoderModel on a GatheringBackend with attention split by heads (module docstring)."""

    def __init__(self, config: Any, tensors: Mapping[str, Any], backend: Any,
                 max_context: int | None, names: Any, heads: HeadRange) -> None:
        check_max_context(max_context)
        self.head_range = heads
        super().__init__(head_split_trunk(config, tensors, backend, names, heads), backend,
                         max_context)

    # Exporting is a collective: every rank runs it (TensorParallelTarget publishes it).
    collective_export = True

    def export_kv(self, state: SequenceState, start: int, end: int
                  ) -> tuple[np.ndarray, np.ndarray]:
        """Every head's keys and values of positions [start, end), gathered from the ranks."""
        keys, values = state.cache.export_rows(start, end)
        group = self.backend.group
        return group.all_gather_heads(keys), group.all_gather_heads(values)

    def import_kv(self, state: SequenceState, keys: np.ndarray, values: np.ndarray) -> None:
        """Append exported positions (every head) to the state: this rank keeps its heads."""
        k0, k1 = self.head_range.rank * self.head_range.kv_heads, \
            (self.head_range.rank + 1) * self.head_range.kv_heads
        state.cache.import_rows(np.ascontiguousarray(keys[:, k0:k1]),
                                np.ascontiguousarray(values[:, k0:k1]))
