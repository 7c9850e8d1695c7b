"""A per-sequence KV cache that truncates to any length, for drafts that get rolled back.

Invariant: positions [0, length) hold the keys and values of the committed tokens and nothing
else is ever read for them. Truncation only moves `length`; stale entries past it stay in the
buffers (always finite, since buffers start as zeros) and are masked by position in attention
until they are overwritten. Capacity grows in multiples of the backend's key block, so a row's
last, partial key block can always be read at full width. Exported rows are host float32 copies
of positions already held, and imported rows are written back with no arithmetic, so a cache
filled by import holds the very bits a cache that computed those positions holds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft.errors import ParameterError


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

    def move(self, sources: Any, destinations: Any) -> None:
        """Copy the keys and values of positions `sources` to `destinations` in every layer
        (a verified token-tree path moving to the positions it stands for)."""
        for layer in range(self.num_layers):
            self.keys[layer] = self.backend.kv_move(self.keys[layer], sources, destinations)
            self.values[layer] = self.backend.kv_move(self.values[layer], sources, destinations)

    def reserve_for(self, new_tokens: int) -> None:
        self._reserve(self.length + new_tokens)

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length

    def export_rows(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Host float32 copies of the keys and values of positions [start, end), each
        [num_layers, num_kv_heads, end - start, head_dim]."""
        if not 0 <= start <= end <= self.length:
            raise ParameterError(f"cannot export positions [{start}, {end}) of a cache holding "
                                 f"{self.length}")
        to_host = self.backend.to_host
        keys = np.stack([np.array(to_host(k[:, start:end]), dtype=np.float32)
                         for k in self.keys])
        values = np.stack([np.array(to_host(v[:, start:end]), dtype=np.float32)
                           for v in self.values])
        return keys, values

    def import_rows(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Append positions from `export_rows` arrays (of a cache of the same model that held
        the same tokens before them) after the positions held."""
        count = keys.shape[2] if keys.ndim == 4 else -1
        expected = (self.num_layers, self.num_kv_heads, count, self.head_dim)
        for name, rows in (("keys", keys), ("values", values)):
            if rows.dtype != np.float32 or rows.shape != expected or count < 1:
                raise ParameterError(f"{name} to import must be float32 [layers, kv heads, "
                                     f"positions, head dim] = {expected}, got {rows.dtype} "
                                     f"{rows.shape}")
        if self.length + count > self.max_length:
            raise ParameterError(f"{self.length + count} positions exceed the cache's "
                                 f"{self.max_length}")
        self._reserve(self.length + count)
        vector = self.backend.vector
        for layer in range(self.num_layers):
            # kv_write takes rows [positions, kv heads, head dim].
            self.write(layer, self.length, vector(keys[layer].transpose(1, 0, 2)),
                       vector(values[layer].transpose(1, 0, 2)))
        self.length += count
