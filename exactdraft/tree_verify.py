"""Verifying a DraftTree from one target pass: keep the deepest path of the target's own samples.

Invariant: the tokens a tree verification reports (the kept drafts, then `token`) are exactly
the tokens serial decoding writes at those positions, and the target's state then holds the
committed sequence and nothing more. The pass gives every tree row the bits of a serial step
over its own path (Target.forward_tree); the walk starts at the root (the last committed token),
samples each row with the keyed sampler at the row's position and with its path as history,
and moves to the child holding that sample, if there is one. So every kept token is the target's
sample given the tokens before it, exactly as in a chain, and siblings never influence a sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exactdraft.drafters.base import DraftTree
from exactdraft.sampling import KeyedSampler, SamplingParams


@dataclass(frozen=True)
class TreeVerdict:
    kept: list[int]  # the drafts kept, in order along the path
    token: int  # the target's own sample after them

    @property
    def accepted(self) -> int:
        return len(self.kept)


def target_rows(tree: DraftTree, last_token: int) -> tuple[list[int], list[int]]:
    """The pass's tokens and parents: row 0 the last committed token, row i + 1 node i."""
    return ([int(last_token), *tree.tokens],
            [-1, *(parent + 1 for parent in tree.parents)])


def walk_tree(rows: Any, tree: DraftTree, *, sampler: KeyedSampler, params: SamplingParams,
              history: Sequence[int], n_prompt: int) -> tuple[list[int], TreeVerdict]:
    """The kept path (row indices from the root, row 0) and the verdict, from the rows of a
    pass over target_rows(tree, history[-1]); history is the committed sequence."""
    tokens, parents = target_rows(tree, history[-1])
    children: dict[int, dict[int, int]] = {}
    for row in range(1, len(tokens)):
        # Of two siblings with the same token the first listed is taken; both would be kept
        # alike, so the choice changes no token.
        children.setdefault(parents[row], {}).setdefault(tokens[row], row)
    path, kept, row = [0], [], 0
    past = list(history)
    while True:
        token = sampler.sample_window(rows[row:row + 1], params, pos=len(past), history=past,
                                      n_prompt=n_prompt)[0]
        child = children.get(row, {}).get(token)
        if child is None:
            return path, TreeVerdict(kept=kept, token=token)
        kept.append(token)
        past.append(token)
        path.append(child)
        row = child

