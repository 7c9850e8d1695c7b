"""HybridModel: the Target for residual stacks of mixers (attention, Gated DeltaNet, Mamba-2,
dense and mixture-of-experts MLPs): qwen3_moe, mixtral, qwen3_next, qwen3_5, nemotron_h.

Invariant: every mixer is row invariant (mixers.py, moe.py, recurrent.py), so a W-row forward
gives each row the bits of a one-row forward at that position and a prompt fed in one pass or
in chunks of any size leaves the same caches, recurrent states and last-row logits; and
truncate(state, L) leaves exactly the state a serial run has after L positions: the KV caches
cut by length, the recurrent states restored from the snapshot at L (or, for an L older than
the last `rollback_window` positions, rebuilt by replaying the kept tokens from the empty
state; recurrent.py). A block is h = h + mixer(rms_norm(h, norm)); a family module builds the
blocks from its checkpoint and hands them over as a Trunk.

For an MTP drafter the model can keep the final hidden rows (the inputs of lm_head) of the
positions it has run (`keep_hidden`), and a pass asked for `features=True` returns them for
every appended row (for a DraftHead); neither changes a logit, since the final norm is row
invariant whether it runs over every row or over the last.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend
from exactdraft.errors import ParameterError
from exactdraft.models.cache import KVCache
from exactdraft.models.decoder import embedding_rows, final_rows, output_rows
from exactdraft.models.mixers import PassContext, SequencePass
from exactdraft.models.recurrent import HybridState
from exactdraft.models.target import Capabilities, Rows

ROLLBACK_WINDOW = 32  # positions whose recurrent state is kept for rollback
REPLAY_CHUNK = 512  # rows per pass when truncation replays tokens


@dataclass
class Block:
    norm: Any  # backend vector, the block's input RMS norm weight
    mixer: Any  # has run(backend, x, PassContext) -> rows


@dataclass(frozen=True)
class HeadShape:
    """One attention layer with a dense MLP at the model's width: the shape a draft head built
    for the model copies (exactdraft.drafters.head_model.HeadConfig.for_target)."""

    source: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float


@dataclass
class Trunk:
    """What a family hands HybridModel."""

    model_type: str
    source: str
    vocab_size: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    eps: float
    embedding: Any  # host table [V, H]
    final_norm: Any  # backend vector
    lm_head: Any  # backend matrix [V, H]
    blocks: list[Block]
    kv_layers: int  # attention mixers, kv_slot 0 .. kv_layers - 1
    num_kv_heads: int
    head_dim: int
    digest: Any  # () -> sha256 hex of the weights used
    mtp: Any = None  # an MTPHead when the checkpoint ships one
    output: Any = None  # host lm_head table [V, H] as stored, for draft heads
    head_shape: HeadShape | None = None  # for draft heads
    extra: dict[str, Any] = field(default_factory=dict)


def run_blocks(be: Backend, blocks: Sequence[Block], hidden: Any, ctx: PassContext,
               eps: float) -> Any:
    for block in blocks:
        hidden = hidden + block.mixer.run(be, be.rms_norm(hidden, block.norm, eps), ctx)
    return hidden


def checked_tokens(tokens: Sequence[int], start: int, vocab_size: int,
                   max_context: int) -> np.ndarray:
    """Token ids as int64, or a ParameterError naming the first bad id or the overrun."""
    ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        raise ParameterError("forward needs at least one token")
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size))
    if bad.size:
        raise ParameterError(f"token id {int(ids[bad[0]])} at index {int(bad[0])} is outside "
                             f"the vocabulary [0, {vocab_size})")
    if start + ids.size > max_context:
        raise ParameterError(f"{start + ids.size} positions exceed the model's context of "
                             f"{max_context}")
    return ids


class HybridModel:
    """A residual stack of mixers on any Backend; implements the Target protocol."""

    def __init__(self, trunk: Trunk, backend: Backend, max_context: int | None = None,
                 rollback_window: int = ROLLBACK_WINDOW) -> None:
        if max_context is not None and (isinstance(max_context, bool) or
                                        not isinstance(max_context, int) or max_context < 1):
            raise ParameterError(f"max_context must be an integer >= 1, got {max_context!r}")
        if isinstance(rollback_window, bool) or not isinstance(rollback_window, int) \
                or rollback_window < 1:
            raise ParameterError(f"rollback_window must be an integer >= 1, got "
                                 f"{rollback_window!r}")
        self.trunk = trunk
        self.backend = backend
        self.vocab_size = trunk.vocab_size
        self.max_context = min(max_context or trunk.max_position_embeddings,
                               trunk.max_position_embeddings)
        self.key_block = backend.key_block
        self.eos_token_ids = trunk.eos_token_ids
        self.arithmetic = backend.arithmetic
        self.rollback_window = rollback_window
        self.blocks = trunk.blocks
        self.recurrent = [b.mixer for b in trunk.blocks if hasattr(b.mixer, "empty_state")]
        self.mtp = trunk.mtp
        self.keep_hidden = False  # set by an MTP drafter
        self._states: weakref.WeakSet[HybridState] = weakref.WeakSet()
        self._digest: str | None = None

    def __repr__(self) -> str:
        return (f"HybridModel({self.trunk.model_type}, {len(self.blocks)} blocks, "
                f"backend={self.backend!r})")

    # -- Target protocol -------------------------------------------------------------------

    def new_state(self) -> HybridState:
        t = self.trunk
        cache = KVCache(self.backend, t.kv_layers, t.num_kv_heads, t.head_dim, self.max_context)
        state = HybridState(cache, [m.empty_state() for m in self.recurrent],
                            self.rollback_window)
        self._states.add(state)
        return state

    def truncate(self, state: HybridState, length: int) -> None:
        """Forget every position >= length: from a held snapshot, or by replaying the kept
        tokens from the empty state when `length` is older than the rollback window."""
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) \
                or not 0 <= length <= state.length:
            raise ValueError(f"cannot truncate a state of length {state.length} to {length}")
        if length == state.length or state.restore(int(length)):
            return
        kept = state.tokens[:length]
        state.reset()
        for begin in range(0, len(kept), REPLAY_CHUNK):
            self.forward(state, kept[begin:begin + REPLAY_CHUNK])

    def forward(self, state: HybridState, tokens: Sequence[int], rows: Rows = "last",
                features: bool = False) -> Any:
        """Logits [R, vocab] of the appended tokens; with `features=True` the pair (logits,
        features [len(tokens), hidden]: the final normed hidden row of every appended token)."""
        if features:
            logits, hidden = self.forward_batch([state], [tokens], rows, features=True)
            return logits[0], hidden[0]
        return self.forward_batch([state], [tokens], rows)[0]

    def forward_batch(self, states: Sequence[HybridState],
                      token_lists: Sequence[Sequence[int]], rows: Rows = "last",
                      features: bool = False) -> Any:
        """Append each token list to its own state in one pass and return each sequence's
        logits [R_i, vocab] (with `features=True`, the pair of that list and each sequence's
        features); every row has the bits it gets when its sequence runs alone."""
        if rows not in ("last", "all"):
            raise ParameterError(f"rows must be 'last' or 'all', got {rows!r}")
        if len(states) != len(token_lists) or not states:
            raise ParameterError(f"forward_batch needs one token list per state, got "
                                 f"{len(states)} states and {len(token_lists)} token lists")
        if len({id(state) for state in states}) != len(states):
            raise ParameterError("a state appears twice in one forward_batch")
        be, t = self.backend, self.trunk
        ids, parts = [], []
        for state, tokens in zip(states, token_lists):
            start = state.length
            checked = checked_tokens(tokens, start, self.vocab_size, self.max_context)
            state.cache.reserve_for(checked.size)
            ids.append(checked)
            keep_from = max(0, checked.size - self.rollback_window)
            parts.append(SequencePass(state, start, checked.size, keep_from))
        ctx = PassContext(be, parts)
        hidden = be.vector(embedding_rows(t.embedding, np.concatenate(ids)))
        hidden = run_blocks(be, self.blocks, hidden, ctx, t.eps)
        slots = range(len(self.recurrent))
        for part, checked in zip(parts, ids):
            part.state.commit(part.start, checked.tolist(), part.keep_from,
                              [part.row_states[self.recurrent[s].slot] for s in slots])
        split, normed = final_rows(be, hidden, [part.count for part in parts], rows,
                                   t.final_norm, t.eps, t.lm_head, self.keep_hidden or features)
        if self.keep_hidden:
            for part, rows_of_part in zip(parts, normed):
                part.state.log_hidden(part.start, rows_of_part)
        return (split, normed) if features else split

    def weights_digest(self) -> str:
        if self._digest is None:
            self._digest = self.trunk.digest()
        return self._digest

    # -- for drafters that read the target's hidden rows ------------------------------------

    # forward(..., features=True) returns each appended row's final hidden state.
    returns_features = True

    @property
    def capabilities(self) -> Capabilities:
        # forward_batch gives every row the bits of its sequence alone; truncate restores the
        # recurrent state; no tree passes and no KV-only prefixes (the state is more than KV).
        return Capabilities(batches_sequences=True, returns_features=True,
                            rolls_back_recurrent=True,
                            describes_head_layer=self.trunk.head_shape is not None,
                            carries_mtp=self.mtp is not None)

    @property
    def head_shape(self) -> HeadShape:
        if self.trunk.head_shape is None:
            raise ParameterError(f"{self!r} does not describe the layer a draft head copies")
        return self.trunk.head_shape

    def embedding_rows(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """float32 rows [len(ids), hidden] of the input embedding table."""
        return embedding_rows(self.trunk.embedding, np.asarray(ids, dtype=np.int64).reshape(-1))

    def output_rows(self, ids: Sequence[int] | np.ndarray, stored: bool = False) -> Any:
        """Rows [len(ids), hidden] of the output matrix (lm_head), float32, or with `stored`
        in the checkpoint's own format (blocks stay blocks), for backend.matrix."""
        table = self.trunk.output
        if table is None:
            raise ParameterError(f"{self!r} keeps no host copy of its output matrix")
        return output_rows(table, np.asarray(ids, dtype=np.int64).reshape(-1), stored)

    def state_holding(self, tokens: Sequence[int]) -> HybridState | None:
        """A live state of this model that holds exactly `tokens`, if any."""
        for state in list(self._states):
            if state.length == len(tokens) and state.tokens == list(tokens):
                return state
        return None
