"""The load-time guard: prove on the loaded weights that verify rows equal serial steps.

Invariant: drafting is only ever switched on for a target on which, for every window W up to
the drafter's largest, a W-row pass has just been shown to give each row the same bytes as W
single steps, starting from a prompt that ends inside a key block so the window crosses a block
boundary. Row invariance is a property of kernels, machines and library versions, so it is
measured where it is used, not assumed; the verdict is kept on the target per window size.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from exactdraft.models.target import Target
from exactdraft.sampling import _mix

# target -> {window: verdict}; a verdict lives as long as its target.
_VERDICTS: weakref.WeakKeyDictionary[Any, dict[int, str | None]] = weakref.WeakKeyDictionary()


def probe_tokens(count: int, vocab_size: int, salt: int = 0) -> list[int]:
    """A fixed, spread-out token sequence (not from any global random state)."""
    return [_mix(salt * 1_000_003 + i) % vocab_size for i in range(count)]


def first_difference(a: np.ndarray, b: np.ndarray) -> str | None:
    """None if the two arrays hold the same bytes, else where and by how much they differ."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shapes or dtypes differ: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
    differs = (a.view(np.uint8).reshape(a.size, -1) != b.view(np.uint8).reshape(b.size, -1))
    positions = np.flatnonzero(differs.any(axis=1))
    if positions.size == 0:
        return None
    gap = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return (f"{positions.size} values differ, first at flat index {int(positions[0])}, "
            f"max |difference| {float(np.nanmax(gap)):.3g}")


def check_row_invariance(target: Target, window: int) -> str | None:
    """None if every W-row pass (W = 2..window) equals W single steps bitwise, else a
    sentence saying what differed. Kept per target and window."""
    try:
        verdicts = _VERDICTS.setdefault(target, {})
    except TypeError:  # a target that cannot be weakly referenced is checked every time
        verdicts = {}
    if window in verdicts:
        return verdicts[window]
    block = target.key_block
    room = target.max_context - window - 1
    if room < 1:
        verdicts[window] = (f"the model's context ({target.max_context}) is too short for a "
                            f"verify window of {window}")
        return verdicts[window]
    prefix_length = max(1, min(block - window // 2, room))
    tokens = probe_tokens(prefix_length + window, target.vocab_size)
    prefix, probe = tokens[:prefix_length], tokens[prefix_length:]
    state = target.new_state()
    target.forward(state, prefix)
    singles = [target.forward(state, [token], rows="last")[0] for token in probe]
    verdict = None
    for width in range(2, window + 1):
        target.truncate(state, prefix_length)
        rows = target.forward(state, probe[:width], rows="all")
        for row in range(width):
            difference = first_difference(rows[row], singles[row])
            if difference is not None:
                verdict = (f"row {row} of a {width}-row pass differs from the single step at "
                           f"that position ({difference})")
                break
        if verdict:
            break
    verdicts[window] = verdict
    return verdict
