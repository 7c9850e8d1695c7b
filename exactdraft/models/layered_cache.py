"""A KV cache whose slots differ in shape: each attention layer's own KV head count and head
size (Gemma 4's global layers have wider heads, and may have fewer of them, than its sliding
layers).

Invariant: the KVCache invariant, slot by slot: positions [0, length) of every slot hold the
keys and values of the committed tokens, buffers grow (and truncate) together, so one length
serves every slot. Exporting and importing prefixes needs one shape for every slot; a model
with several shapes declares no KV prefixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exactdraft.models.cache import KVCache


class LayeredKVCache(KVCache):
    def __init__(self, backend: Any, shapes: Sequence[tuple[int, int]], max_length: int,
                 initial_capacity: int = 256) -> None:
        """`shapes[slot]` is (KV heads, head size) of that slot."""
        self.shapes = [tuple(shape) for shape in shapes]
        heads, head_dim = self.shapes[0]
        super().__init__(backend, len(self.shapes), heads, head_dim, max_length,
                         initial_capacity)

    def _reserve(self, length: int) -> None:
        if length <= self.capacity:
            return
        capacity = self._rounded(max(length, 2 * self.capacity))
        capacity = max(min(capacity, self._rounded(self.max_length)), self._rounded(length))
        buffer = self.backend.kv_buffer
        old_keys = self.keys or [None] * len(self.shapes)
        old_values = self.values or [None] * len(self.shapes)
        self.keys = [buffer(heads, capacity, dim, old) for (heads, dim), old in
                     zip(self.shapes, old_keys)]
        self.values = [buffer(heads, capacity, dim, old) for (heads, dim), old in
                       zip(self.shapes, old_values)]
        self.capacity = capacity
