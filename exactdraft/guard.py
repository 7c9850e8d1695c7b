"""The load-time guard: prove on the loaded weights that verify rows equal serial steps.

Invariant: drafting is only ever switched on for a target on which, for every window W up to
the drafter's largest, a W-row pass has just been shown to give each row the same bytes as W
single steps, starting from a prompt that ends inside a key block so the window crosses a block
boundary; and on which rolling the widest pass back to its middle and stepping once has been
shown to give the serial step's bytes at that position (so truncation restores all the state a
step reads: the KV caches, and the recurrent state of hybrid models). Row invariance is a
property of kernels, machines and library versions, so it is measured where it is used, not
assumed; the verdict is kept on the target per window size.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from exactdraft.models.target import Pass, PassSequence, Target, capabilities_of, run_pass
from exactdraft.sampling.keyed import mix64

# target -> {window: verdict}; a verdict lives as long as its target.
_VERDICTS: weakref.WeakKeyDictionary[Any, dict[int, str | None]] = weakref.WeakKeyDictionary()


def probe_tokens(count: int, vocab_size: int, salt: int = 0) -> list[int]:
    """A fixed, spread-out token sequence (not from any global random state)."""
    return [mix64(salt * 1_000_003 + i) % vocab_size for i in range(count)]


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
    """None if every W-row pass (W = 2..window) equals W single steps bitwise and a step
    after rolling the widest pass back to its middle equals the serial step there, else a
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
    if verdict is None:
        middle = window // 2
        target.truncate(state, prefix_length + middle)
        again = target.forward(state, [probe[middle]], rows="last")[0]
        difference = first_difference(again, singles[middle])
        if difference is not None:
            verdict = (f"a step after rolling a {window}-row pass back to {middle} rows differs "
                       f"from the serial step at that position ({difference})")
    verdicts[window] = verdict
    return verdict


def probe_tree(nodes: int) -> list[int]:
    """Parents of a probe token tree of `nodes` rows below its root: two interleaved chains
    hanging from the root, so the pass holds siblings, cousins and rows at every depth."""
    return [-1] + [0 if row <= 2 else row - 2 for row in range(1, nodes + 1)]


def check_tree_invariance(target: Target, nodes: int) -> str | None:
    """None if every row of a probe tree of `nodes` nodes equals a serial step over its own
    path bitwise, and committing the second chain's path then stepping equals the serial step
    there, else a sentence saying what differed. Kept per target and tree size."""
    try:
        verdicts = _VERDICTS.setdefault(target, {})
    except TypeError:
        verdicts = {}
    key = -nodes  # tree verdicts sit beside the window verdicts, keyed apart
    if key in verdicts:
        return verdicts[key]
    if not capabilities_of(target).verifies_trees:
        verdicts[key] = f"{target!r} cannot verify token trees in one pass"
        return verdicts[key]
    depth = (nodes + 1) // 2 + 1
    room = target.max_context - depth - 1
    if room < 1 or target.max_context < nodes + 2:
        verdicts[key] = (f"the model's context ({target.max_context}) is too short for a "
                         f"token tree of {nodes} nodes")
        return verdicts[key]
    parents = probe_tree(nodes)
    prefix_length = max(1, min(target.key_block - depth // 2, room))
    tokens = probe_tokens(prefix_length + nodes + 1, target.vocab_size, salt=7)
    prefix, tree_tokens = tokens[:prefix_length], tokens[prefix_length:]
    state = target.new_state()
    target.forward(state, prefix)
    rows = run_pass(target, Pass([PassSequence(state, tree_tokens, parents)], "all"))[0].logits
    verdict = None
    for first in (1, 2):  # the two chains: rows first, first + 2, first + 4, ...
        path = [0, *range(first, nodes + 1, 2)]
        serial = target.new_state()
        target.forward(serial, prefix)
        for row in path:
            single = target.forward(serial, [tree_tokens[row]], rows="last")[0]
            difference = first_difference(rows[row], single)
            if difference is not None:
                verdict = (f"row {row} of a {nodes}-node token tree differs from the serial "
                           f"step over its path ({difference})")
                break
        if verdict:
            break
    if verdict is None:
        path = [0, *range(2, nodes + 1, 2)]
        target.commit_tree(state, path)
        again = target.forward(state, [tokens[0]], rows="last")[0]
        serial = target.new_state()
        target.forward(serial, prefix + [tree_tokens[row] for row in path])
        expected = target.forward(serial, [tokens[0]], rows="last")[0]
        difference = first_difference(again, expected)
        if difference is not None:
            verdict = (f"a step after committing a path of a {nodes}-node token tree differs "
                       f"from the serial step ({difference})")
    verdicts[key] = verdict
    return verdict
