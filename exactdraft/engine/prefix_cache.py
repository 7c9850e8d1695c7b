"""PrefixCache: keys and values of token prefixes, shared by the sequences that start with them.

Invariant: a block is used only for the exact token prefix it was computed for. Block i of a
sequence holds the keys and values of positions [i B, (i + 1) B) (B = block_tokens), which
depend on every token before them, so its key is a sha256 chain over the whole prefix (the
parent block's key, then this block's tokens), and a lookup also compares the block's own
tokens. The arrays are host float32 copies of what the model computed, imported back with no
arithmetic, so a sequence started from cached blocks holds the bits a cold prefill leaves and
writes the tokens a cold run writes (chunked prefill equals one-pass prefill).

Blocks are reference counted: a live sequence holds every block of its prefix, and only blocks
no sequence holds are evicted, least recently used first, when the cache is over its budget. A
block is never less recently used than the blocks after it in its chain, so eviction removes
chain ends first and never leaves a block whose parent is gone. A prefix longer than the budget
keeps its longest leading run of blocks that fits: each stored block is held as it is added, so
adding the next one can evict other blocks but never the ones before it. Thread-safe.

The default budget follows the machine: a quarter of the memory available when the cache is
made, at least 256 MiB and at most 8 GiB (`default_budget_bytes`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactdraft.errors import ParameterError

ROOT = hashlib.sha256(b"exactdraft prefix cache root").digest()
BUDGET_SHARE = 4  # the default budget is 1/BUDGET_SHARE of the available memory
MIN_BUDGET_BYTES = 256 * 2**20
MAX_BUDGET_BYTES = 8 * 2**30


def available_memory_bytes() -> int | None:
    """The memory the system could give this process now (MemAvailable on Linux, else the
    physical memory), or None where neither can be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def default_budget_bytes(available_bytes: int | None) -> int:
    """The default budget for a machine with `available_bytes` of free memory (None: unknown):
    1/BUDGET_SHARE of it, within [MIN_BUDGET_BYTES, MAX_BUDGET_BYTES]."""
    if available_bytes is None:
        return MIN_BUDGET_BYTES
    return max(MIN_BUDGET_BYTES, min(MAX_BUDGET_BYTES, available_bytes // BUDGET_SHARE))


def block_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The key of a block with these tokens after the prefix whose last block is `parent`."""
    return hashlib.sha256(parent + np.asarray(tokens, dtype="<i8").tobytes()).digest()


@dataclass(eq=False)
class Block:
    key: bytes
    parent: bytes
    tokens: tuple[int, ...]  # this block's own tokens
    keys: np.ndarray  # float32 [layers, kv heads, block_tokens, head dim]
    values: np.ndarray  # the same shape
    references: int = field(default=0)
    from_file: bool = False  # read from a cache file, not computed by this process

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


@dataclass
class CacheStats:
    lookups: int = 0
    hit_tokens: int = 0  # prompt positions taken from the cache instead of computed
    stored_blocks: int = 0
    evicted_blocks: int = 0


class PrefixCache:
    """Blocks of `block_tokens` positions, at most `budget_bytes` of keys and values in all
    (blocks held by live sequences may exceed it until released; None: the default budget for
    the memory available now)."""

    def __init__(self, budget_bytes: int | None = None, block_tokens: int = 16) -> None:
        if budget_bytes is None:
            budget_bytes = default_budget_bytes(available_memory_bytes())
        for name, value in (("budget_bytes", budget_bytes), ("block_tokens", block_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ParameterError(f"{name} must be an integer >= 1, got {value!r}")
        self.budget_bytes = budget_bytes
        self.block_tokens = block_tokens
        self.stats = CacheStats()
        self.bytes = 0
        self._blocks: OrderedDict[bytes, Block] = OrderedDict()  # least recently used first
        self._lock = threading.RLock()  # re-entered by store, which holds what it inserts

    def __len__(self) -> int:
        return len(self._blocks)

    def blocks(self) -> list[Block]:
        """Every block, parents before children (the order persistence needs)."""
        with self._lock:
            return _parents_first(list(self._blocks.values()))

    def acquire(self, tokens: Sequence[int]) -> list[Block]:
        """The cached blocks of the longest block-aligned prefix of `tokens`, each now held
        once more by the caller (give them back with `release`)."""
        size = self.block_tokens
        chain: list[Block] = []
        with self._lock:
            parent = ROOT
            for begin in range(0, len(tokens) - size + 1, size):
                own = tuple(int(t) for t in tokens[begin:begin + size])
                block = self._blocks.get(block_key(parent, own))
                if block is None or block.tokens != own or block.parent != parent:
                    break
                chain.append(block)
                parent = block.key
            for block in chain:
                block.references += 1
            self._touch(chain)
            self.stats.lookups += 1
            self.stats.hit_tokens += size * len(chain)
        return chain

    def release(self, blocks: Sequence[Block]) -> None:
        with self._lock:
            for block in blocks:
                block.references -= 1
            self._evict()

    def store(self, target: Any, state: Any, tokens: Sequence[int],
              held: list[Block]) -> list[Block]:
        """Add the blocks of tokens[:state.length] that are not cached yet, exported from the
        state (which holds those tokens), and return the caller's chain: `held` (a prefix of
        it the caller already holds) extended by the blocks after it, each held once more."""
        size = self.block_tokens
        full = min(state.length, len(tokens)) // size
        chain = list(held)
        parent = chain[-1].key if chain else ROOT
        exported, first = None, 0  # the missing blocks' rows, exported in one go
        try:
            for index in range(len(chain), full):
                own = tuple(int(t) for t in tokens[index * size:(index + 1) * size])
                key = block_key(parent, own)
                with self._lock:
                    block = self._blocks.get(key)
                    if block is not None:
                        block.references += 1
                if block is None:
                    if exported is None:
                        first = index
                        exported = target.export_kv(state, index * size, full * size)
                    rows = slice((index - first) * size, (index - first + 1) * size)
                    keys, values = (np.ascontiguousarray(part[:, :, rows]) for part in exported)
                    with self._lock:  # held from the moment it is in: the next cannot evict it
                        block = self._insert(Block(key, parent, own, keys, values))
                        if block is not None:
                            block.references += 1
                if block is None:  # no room: the blocks before it and held ones fill the budget
                    break
                chain.append(block)
                parent = key
        except BaseException:
            self.release(chain[len(held):])
            raise
        with self._lock:
            self._touch(chain)
            self._evict()
        return chain

    def add(self, block: Block) -> bool:
        """Insert a block read from elsewhere (a cache file) whose parent is cached or ROOT."""
        with self._lock:
            if block.parent != ROOT and block.parent not in self._blocks:
                return False
        return self._insert(block) is not None

    def _insert(self, block: Block) -> Block | None:
        with self._lock:
            present = self._blocks.get(block.key)
            if present is not None:
                return present
            self.bytes += block.nbytes
            self._blocks[block.key] = block
            self._evict(keep=block)
            if block.key not in self._blocks:
                return None
            self.stats.stored_blocks += 1
            return block

    def _touch(self, chain: list[Block]) -> None:
        # Chain ends first, so a parent is always more recently used than its children.
        for block in reversed(chain):
            if block.key in self._blocks:
                self._blocks.move_to_end(block.key)

    def _evict(self, keep: Block | None = None) -> None:
        """Drop unheld blocks, least recently used first, until within the budget."""
        if self.bytes <= self.budget_bytes:
            return
        for key, block in list(self._blocks.items()):
            if self.bytes <= self.budget_bytes:
                break
            if block.references == 0 and block is not keep:
                del self._blocks[key]
                self.bytes -= block.nbytes
                self.stats.evicted_blocks += 1
        if keep is not None and self.bytes > self.budget_bytes and keep.references == 0:
            del self._blocks[keep.key]
            self.bytes -= keep.nbytes


def _parents_first(blocks: list[Block]) -> list[Block]:
    present = {block.key for block in blocks}
    children: dict[bytes, list[Block]] = {}
    for block in blocks:
        children.setdefault(block.parent if block.parent in present else ROOT, []).append(block)
    ordered, frontier = [], [ROOT]
    while frontier:
        for block in children.get(frontier.pop(), []):
            ordered.append(block)
            frontier.append(block.key)
    return ordered
