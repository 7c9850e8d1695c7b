"""The Target protocol: the model that drafts are checked against, and the one pass entry.

Invariant: every row a pass returns has the same bits that row gets from a one-token forward at
the same position of its own sequence (row invariance, INVARIANCE.md), whatever else shares the
pass: the other rows of its window, the nodes of a token tree, other sequences. That is what
lets a verify window stand in for serial steps without changing a single sampled token.

A target says what it can do in `capabilities` (data with defaults, read through
`capabilities_of`, never probed). A pass is described once (`Pass`: its sequences, each with the
tokens it appends and, for a token tree, their parents; whether every row or the last is
wanted; whether features are) and run through `run_pass`, the one place that picks the target's
entry point for it. The Generator's loop, the Engine and the guard all go through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from exactdraft.errors import ParameterError

Rows = Literal["last", "all"]


@dataclass(frozen=True)
class Capabilities:
    """What a target can do beyond the required protocol; every field defaults to no."""

    # forward_batch(states, token_lists, rows, features, parents): many sequences in one pass,
    # each row with the bits of its sequence alone.
    batches_sequences: bool = False
    # export_kv / import_kv: a state is its KV cache alone, so prompt prefixes can be cached.
    kv_prefixes: bool = False
    # forward_tree / commit_tree: a token tree in one pass, each row the bits of its path.
    verifies_trees: bool = False
    # forward(..., features=True) also returns every appended row's final hidden state, and
    # embedding_rows / output_rows give the tables a draft head reads.
    returns_features: bool = False
    # truncate restores recurrent state (a snapshot or a replay), not just a KV length.
    rolls_back_recurrent: bool = False
    # head_shape describes the attention layer a draft head copies (else `config` does).
    describes_head_layer: bool = False
    # mtp: the checkpoint's own multi-token-prediction layers (MTPDrafter), with keep_hidden
    # and state_holding.
    carries_mtp: bool = False
    # The model runs on several ranks (tensor parallel): check() raises when the target can no
    # longer run a pass (a rank died or hangs), so a server idle between requests learns it at
    # once; close() ends the run on every rank (a server's last act before it exits).
    spans_ranks: bool = False


NOTHING_OPTIONAL = Capabilities()


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
    # What it can do beyond this protocol (optional: a target without it has NOTHING_OPTIONAL).
    capabilities: Capabilities

    def new_state(self) -> TargetState:
        """An empty per-sequence state (KV cache)."""

    def forward(self, state: Any, tokens: Sequence[int], rows: Rows = "last") -> np.ndarray:
        """Append tokens at positions state.length.. and return float32 logits [R, vocab]."""

    def truncate(self, state: Any, length: int) -> None:
        """Forget every position >= length (rollback of rejected drafts)."""

    def weights_digest(self) -> str:
        """sha256 (hex) of the weights as loaded: equal digests mean the same weights."""


def capabilities_of(target: Any) -> Capabilities:
    """The target's declared capabilities; the protocol's default for one that declares none."""
    return getattr(target, "capabilities", NOTHING_OPTIONAL)


def backend_of(target: Any) -> Any:
    """The backend a target runs on (its optional `backend`), or None for one that names none."""
    return getattr(target, "backend", None)


def backend_label(target: Any) -> str:
    """"name device dtype" of the target's backend, or the target's class name for one that
    names none: what receipts report."""
    backend = backend_of(target)
    return type(target).__name__ if backend is None else \
        f"{backend.name} {backend.device} {backend.dtype}"


def describe(target: Any) -> str:
    """"model=..., backend=..., arithmetic=..." for reprs: the target's class and model type
    (where its optional `config` or `trunk` names one), its backend and its arithmetic (None
    where a stand-in target has none)."""
    described = getattr(target, "config", None) or getattr(target, "trunk", None)
    kind = getattr(described, "model_type", None)
    model = f"{type(target).__name__}({kind})" if kind else type(target).__name__
    return (f"model={model}, backend={backend_of(target)!r}, "
            f"arithmetic={getattr(target, 'arithmetic', None)!r}")


@dataclass
class PassSequence:
    """One sequence's part of a pass: the tokens appended to its state, and for a token tree
    each token's parent (an index into `tokens`, -1 for the root, which is tokens[0])."""

    state: Any
    tokens: list[int]
    parents: list[int] | None = None


@dataclass
class Pass:
    """One target pass over one or more sequences."""

    sequences: list[PassSequence]
    rows: Rows = "last"  # every appended row's logits, or each sequence's last
    features: bool = False  # also each appended row's final hidden state

    def __post_init__(self) -> None:
        if not self.sequences:
            raise ParameterError("a pass needs at least one sequence")
        if self.rows not in ("last", "all"):
            raise ParameterError(f"rows must be 'last' or 'all', got {self.rows!r}")
        if any(part.parents is not None for part in self.sequences) and self.rows != "all":
            raise ParameterError("a token tree needs rows='all'")


@dataclass
class PassRows:
    """What a pass returns for one sequence."""

    logits: np.ndarray  # [rows, vocab] float32: every appended row, or the last
    features: np.ndarray | None = None  # [appended rows, hidden] float32, when asked for


def run_pass(target: Target, description: Pass) -> list[PassRows]:
    """Run one pass and return each sequence's rows, in order. The one dispatch: a single
    sequence goes to forward (a chain) or forward_tree (a tree), several to forward_batch;
    features only from a target that declares returns_features, trees and batches only from
    one that declares them."""
    can = capabilities_of(target)
    parts = description.sequences
    options: dict[str, Any] = {}
    if description.features:
        if not can.returns_features:
            raise ParameterError(f"{target!r} does not return features")
        options["features"] = True
    trees = [part.parents for part in parts]
    if any(parents is not None for parents in trees) and not can.verifies_trees:
        raise ParameterError(f"{target!r} cannot verify token trees in one pass")
    if len(parts) == 1:
        part = parts[0]
        if part.parents is not None:
            out = target.forward_tree(part.state, part.tokens, part.parents, **options)
        else:
            out = target.forward(part.state, part.tokens, rows=description.rows, **options)
        return [PassRows(*out) if description.features else PassRows(out)]
    if not can.batches_sequences:
        raise ParameterError(f"{target!r} runs one sequence per pass")
    if any(parents is not None for parents in trees):
        options["parents"] = trees
    out = target.forward_batch([part.state for part in parts], [part.tokens for part in parts],
                               rows=description.rows, **options)
    if description.features:
        return [PassRows(logits, features) for logits, features in zip(*out)]
    return [PassRows(logits) for logits in out]
