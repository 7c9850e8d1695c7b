"""The rows of a token tree in one pass: depths, ancestor paths, and the moves that commit a path.

Invariant: row r of a tree pass sits at position base + depth(r) and sees, for each depth
d <= depth(r), the key its ancestor at depth d wrote (paths[r, d]); so it reads exactly the keys
a serial step over its own path reads, at the same positions. The tree's rows occupy slots
base .. base + n - 1 in pass order; committing a path moves the path's keys and values to the
slots of the positions they stand for, base + d, which leaves the cache as a serial run over
that path would.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from exactdraft.errors import ParameterError


def tree_rows(parents: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """depths int32 [n] and paths int32 [n, n] (row r's ancestor at depth d in paths[r, d],
    paths[r, depth(r)] = r; unused entries 0) of a tree given by its parents: row 0 is the root
    (parent -1), and every other row's parent is an earlier row."""
    count = len(parents)
    if count == 0:
        raise ParameterError("a token tree needs at least its root row")
    if int(parents[0]) != -1:
        raise ParameterError(f"a token tree's row 0 is its root (parent -1), got parent "
                             f"{parents[0]!r}")
    depths = np.zeros(count, dtype=np.int32)
    paths = np.zeros((count, count), dtype=np.int32)
    for row in range(1, count):
        parent = parents[row]
        if isinstance(parent, bool) or not isinstance(parent, (int, np.integer)) or \
                not 0 <= parent < row:
            raise ParameterError(f"token tree row {row}: parent must be an earlier row "
                                 f"(0..{row - 1}), got {parent!r}")
        depth = depths[parent] + 1
        depths[row] = depth
        paths[row, :depth] = paths[parent, :depth]
        paths[row, depth] = row
    return depths, paths


def check_path(parents: Sequence[int], path: Sequence[int]) -> None:
    """A ParameterError unless `path` runs from the root down the tree: path[0] = 0 and each
    entry is a child of the one before."""
    if not path or path[0] != 0:
        raise ParameterError(f"a committed path starts at the root row 0, got {list(path)!r}")
    for before, row in zip(path, path[1:]):
        if not 0 < row < len(parents) or parents[row] != before:
            raise ParameterError(f"row {row!r} of the committed path {list(path)!r} is not a "
                                 f"child of row {before}")


def path_moves(base: int, path: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(sources, destinations): the slots whose keys and values move so that position base + d
    holds path[d]'s. Moving in this order never overwrites a slot still to be read, since
    path[d] >= d."""
    moves = [(base + row, base + depth) for depth, row in enumerate(path) if row != depth]
    if not moves:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    sources, destinations = zip(*moves)
    return np.array(sources, dtype=np.int64), np.array(destinations, dtype=np.int64)
