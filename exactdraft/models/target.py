"""The Target protocol: the model that drafts are checked against.

Invariant: `forward(state, tokens, rows="all")` returns, for each row, the same bits that row
gets from a one-token forward at the same position (row invariance, INVARIANCE.md), and
`rows="last"` returns the last of those rows. That is what lets a verify window stand in for
serial steps without changing a single sampled token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

Rows = Literal["last", "all"]


@runtime_checkable
class Target(Protocol):
    vocab_size: int
    max_context: int

    def new_state(self) -> Any:
        """An empty per-sequence state (KV cache)."""

    def forward(self, state: Any, tokens: Sequence[int], rows: Rows = "last") -> np.ndarray:
        """Append tokens at positions state.length.. and return float32 logits [R, vocab]."""

    def truncate(self, state: Any, length: int) -> None:
        """Forget every position >= length (rollback of rejected drafts)."""
