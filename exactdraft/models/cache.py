"""A per-sequence KV cache that truncates to any length, for drafts that get rolled back.

Invariant: positions [0, length) hold the keys and values of the committed tokens and nothing
else is ever read for them. Truncation only moves `length`; stale entries past it stay in the
buffers (always finite, since buffers start as zeros) and are masked by position in attention
until they are overwritten. Capacity grows in multiples of the backend's key block, so a row's
last, partial key block can always be read at full width.
"""

from __future__ import annotations

from typing import Any


class KVCache:
    def __init__(self, backend: Any, num_layers: int, num_kv_heads: int, head_dim: int,
                 max_length: int, initial_capacity: int = 256) -> None:
        self.backend = backend
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.max_length = max_length
        self.length = 0
        self.capacity = 0
        self.keys: list[Any] = []
        self.values: list[Any] = []
        self._reserve(initial_capacity)

    def _rounded(self, length: int) -> int:
        block = self.backend.key_block
        return -(-length // block) * block

    def _reserve(self, length: int) -> None:
        """Make room for `length` positions, at least doubling so growth stays amortised."""
        if length <= self.capacity:
            return
        capacity = self._rounded(max(length, 2 * self.capacity))
        capacity = min(capacity, self._rounded(self.max_length))
        capacity = max(capacity, self._rounded(length))
        backend = self.backend
        fresh_keys, fresh_values = [], []
        for layer in range(self.num_layers):
            old_keys = self.keys[layer] if self.keys else None
            old_values = self.values[layer] if self.values else None
            fresh_keys.append(backend.kv_buffer(self.num_kv_heads, capacity, self.head_dim,
                                                old_keys))
            fresh_values.append(backend.kv_buffer(self.num_kv_heads, capacity, self.head_dim,
                                                  old_values))
        self.keys, self.values, self.capacity = fresh_keys, fresh_values, capacity

    def write(self, layer: int, start: int, keys: Any, values: Any) -> None:
        self.keys[layer] = self.backend.kv_write(self.keys[layer], start, keys)
        self.values[layer] = self.backend.kv_write(self.values[layer], start, values)

    def reserve_for(self, new_tokens: int) -> None:
        self._reserve(self.length + new_tokens)

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length
