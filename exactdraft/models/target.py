"""The Target protocol: the model that drafts are checked against.

Invariant: `forward(state, tokens, rows="all")` returns, for each row, the same bits that row
gets from a one-token forward at the same position (row invariance, INVARIANCE.md), and
`rows="last"` returns the last of those rows. That is what lets a verify window stand in for
serial steps without changing a single sampled token. Everything the generator, the guard and
the testing helpers use of a model is declared here; they read nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

Rows = Literal["last", "all"]


@runtime_checkable
class TargetState(Protocol):
    # Positions already held (the committed sequence, plus any drafts not yet truncated).
    length: int


@runtime_checkable
class Target(Protocol):
    vocab_size: int
    max_context: int
    # Attention reduces keys in blocks of this many absolute positions; probes that must cross
    # a block boundary (the load-time guard's) start from it.
    key_block: int
    # Tokens that end a generation when no tokenizer says otherwise.
    eos_token_ids: tuple[int, ...]
    # The arithmetic contract of the model's bits (see Backend.arithmetic).
    arithmetic: str

    def new_state(self) -> TargetState:
        """An empty per-sequence state (KV cache)."""

    def forward(self, state: Any, tokens: Sequence[int], rows: Rows = "last") -> np.ndarray:
        """Append tokens at positions state.length.. and return float32 logits [R, vocab]."""

    def truncate(self, state: Any, length: int) -> None:
        """Forget every position >= length (rollback of rejected drafts)."""

    def weights_digest(self) -> str:
        """sha256 (hex) of the weights as loaded: equal digests mean the same weights."""
