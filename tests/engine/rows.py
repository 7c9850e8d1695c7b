"""A sampler that keeps the logits row behind every token it draws, keyed by the token's whole
context, so runs that share passes can be compared with runs alone row by row.

The context (every token before the position) names the row exactly: a row invariant target
gives a context one row, however the pass that computed it was shaped. A row recorded twice for
one context with other bytes is itself a difference (`conflicts`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft import KeyedSampler
from exactdraft.guard import first_difference


class ContextRows(KeyedSampler):
    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[tuple[int, ...], bytes] = {}
        self.conflicts: list[str] = []

    def sample_window(self, rows: Any, params: Any, *, pos: int, history: Any,
                      n_prompt: Any = None, drafts: Any = ()) -> list[int]:
        samples = super().sample_window(rows, params, pos=pos, history=history,
                                        n_prompt=n_prompt, drafts=drafts)
        for j in range(len(samples)):
            context = (*history, *drafts[:j])
            row = np.asarray(rows[j], dtype=np.float32).tobytes()
            if self.rows.setdefault(context, row) != row:
                self.conflicts.append(f"two rows for the context ending {context[-5:]}")
        return samples

    def forget(self) -> None:
        self.rows.clear()
        self.conflicts.clear()


def row_differences(batched: dict[tuple[int, ...], bytes],
                    alone: dict[tuple[int, ...], bytes]) -> list[str]:
    """Contexts whose rows differ between the two recordings (each context of `batched` must
    have been recorded alone too)."""
    found = []
    for context, row in batched.items():
        assert context in alone, f"the context ending {context[-5:]} never ran alone"
        if row != alone[context]:
            left = np.frombuffer(row, dtype=np.float32)
            right = np.frombuffer(alone[context], dtype=np.float32)
            found.append(f"context ending {context[-5:]}: {first_difference(left, right)}")
    return found
