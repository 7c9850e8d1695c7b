"""DecoderModel: the one Target of every family. A decoder is a list of layers, each a token
mixer (attention, sliding-window attention, Gated DeltaNet, Mamba-2) and a feed-forward (dense,
mixture of experts); a family module builds the layers from its checkpoint and hands them over
as a Trunk.

Invariant: the model is written once against the Backend protocol and never branches on the
backend, and every mixer and feed-forward is row invariant (mixers.py, moe.py, recurrent.py);
so a W-row forward gives each row the bits of a one-row forward at that position, a prompt fed
in one pass or in chunks of any size leaves the same state and last-row logits, and a batched
pass gives each sequence the bits it gets alone. truncate(state, L) leaves exactly the state a
serial run has after L positions: the KV caches cut by length, the recurrent states restored
from the snapshot at L or, for an L older than the last `rollback_window` positions, rebuilt by
replaying the kept tokens from the empty state (state.py). When the backend declares fused
layers and every layer is one it can fuse (an attention mixer and a gated dense feed-forward),
the stack runs through the backend's plans, built here once at load; their bits are those of
the per-op path (Layer.run, layer.py).

A pass asked for `features=True` also returns the final hidden state of every row it appended
(after the final norm: the input of lm_head), with the same row invariance as the logits; an
MTP drafter can have the model keep those rows (`keep_hidden`). Neither changes a logit, since
the final norm is row invariant whether it runs over every row or over the last.

What a model can do is data (`capabilities`, exactdraft.models.target.Capabilities), never
probed: every model batches sequences and returns features; the family declares in its Trunk
whether a state is its KV cache alone (KV prefixes export and import) and whether token trees
verify in one pass; a trunk with recurrent layers may declare neither (their state is more than
a KV cache and cannot hold a tree). A model whose states are more than their KV caches logs
each state's tokens, and truncate rolls it back by snapshot or replay.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend, DecoderLayer, LayerShape, SequenceLayers
from exactdraft.errors import ParameterError
from exactdraft.models.cache import KVCache
from exactdraft.models.layer import Layer, fused_layer, run_layers
from exactdraft.models.mixers import PassContext, SequencePass
from exactdraft.models.rows import checked_tokens, embedding_rows, final_rows, output_rows
from exactdraft.models.state import SequenceState
from exactdraft.models.target import Capabilities, Rows
from exactdraft.models.token_tree import check_path, path_moves, tree_rows

ROLLBACK_WINDOW = 32  # positions whose recurrent state is kept for rollback
REPLAY_CHUNK = 512  # rows per pass when truncation replays tokens


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
    """What a family hands DecoderModel."""

    model_type: str
    source: str
    vocab_size: int
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    eps: float  # of every RMS norm
    hidden_size: int
    embedding: Any  # host table [V, H] (rows are taken per pass)
    final_norm: Any  # backend vector
    lm_head: Any  # backend matrix [V, H]
    layers: list[Layer]
    kv_layers: int  # attention mixers, kv_slot 0 .. kv_layers - 1
    num_kv_heads: int
    head_dim: int
    digest: Callable[[], str]  # sha256 hex of the weights used
    output_table: Callable[[], Any] | None = None  # host lm_head table [V, H] as stored
    embedding_scale: float | None = None  # the embedding rows are multiplied by it
    config: Any = None  # the family's config
    mtp: Any = None  # an MTPHead when the checkpoint ships one
    head_shape: HeadShape | None = None  # for draft heads
    # Declared by the family (module docstring): a state is its KV cache alone, so prefixes
    # export and import; token trees verify in one pass (where the backend has tree attention).
    kv_prefixes: bool = False
    verifies_trees: bool = False


def check_max_context(max_context: Any) -> None:
    if max_context is not None and (isinstance(max_context, bool) or
                                    not isinstance(max_context, int) or max_context < 1):
        raise ParameterError(f"max_context must be an integer >= 1, got {max_context!r}")


class DecoderModel:
    """A decoder (a list of layers) on any Backend; implements the Target protocol."""

    # forward(..., features=True) also returns each appended row's final hidden state.
    returns_features = True

    def __init__(self, trunk: Trunk, backend: Backend, max_context: int | None = None,
                 rollback_window: int = ROLLBACK_WINDOW) -> None:
        check_max_context(max_context)
        if isinstance(rollback_window, bool) or not isinstance(rollback_window, int) \
                or rollback_window < 1:
            raise ParameterError(f"rollback_window must be an integer >= 1, got "
                                 f"{rollback_window!r}")
        self.trunk = t = trunk
        self.config = t.config
        self.backend = backend
        self.vocab_size = t.vocab_size
        self.max_context = min(max_context or t.max_position_embeddings,
                               t.max_position_embeddings)
        self.key_block = backend.key_block
        self.eos_token_ids = t.eos_token_ids
        self.arithmetic = backend.arithmetic
        self.rollback_window = rollback_window
        self.layers = t.layers
        self.embedding, self.final_norm, self.lm_head = t.embedding, t.final_norm, t.lm_head
        self.embedding_scale = None if t.embedding_scale is None else \
            backend.vector(np.array([t.embedding_scale], dtype=np.float32))
        self.recurrent = [layer.mixer for layer in t.layers
                          if hasattr(layer.mixer, "empty_state")]
        if self.recurrent and (t.kv_prefixes or t.verifies_trees):
            raise ParameterError(f"{t.source}: a trunk with recurrent layers can neither "
                                 "export KV prefixes nor hold token trees")
        # forward_batch gives every row the bits of its sequence alone (tests/models/
        # test_batched); where the family declares it, a state is its KV cache alone, so a
        # prefix's keys and values can be exported and imported (an exact prefix cache).
        self.batches_sequences = True
        self.kv_prefixes = t.kv_prefixes
        self.mtp = t.mtp
        self.keep_hidden = False  # set by an MTP drafter
        self._states: weakref.WeakSet[SequenceState] = weakref.WeakSet()
        self._digest: str | None = None
        # Rope tables by first use, and the table of each layer (None: no rope there).
        ropes = [getattr(layer.mixer, "rope", None) for layer in t.layers]
        self.rope_tables = list({id(r): r for r in ropes if r is not None}.values())
        self.layer_rope = [None if r is None else next(i for i, table in
                                                       enumerate(self.rope_tables)
                                                       if table is r) for r in ropes]
        self.fused: list[tuple[DecoderLayer, LayerShape]] | None = None
        self.plans = None
        if backend.fused_layers:
            fused = [fused_layer(layer, i, t.eps, t.hidden_size)
                     for i, layer in enumerate(t.layers)]
            if all(entry is not None for entry in fused):
                # The plans hold the addresses of these layers' arrays: they must live on.
                self.fused = fused
                self.plans = [backend.plan_layer(layer, shape) for layer, shape in fused]

    def __repr__(self) -> str:
        return (f"DecoderModel({self.trunk.model_type}, {len(self.layers)} layers, "
                f"backend={self.backend!r})")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(batches_sequences=self.batches_sequences,
                            kv_prefixes=self.kv_prefixes, verifies_trees=self.supports_trees,
                            returns_features=self.returns_features,
                            rolls_back_recurrent=not self.kv_prefixes,
                            describes_head_layer=self.trunk.head_shape is not None,
                            carries_mtp=self.mtp is not None)

    # -- Target protocol -------------------------------------------------------------------

    def new_state(self) -> SequenceState:
        t = self.trunk
        cache = KVCache(self.backend, t.kv_layers, t.num_kv_heads, t.head_dim, self.max_context)
        state = SequenceState(cache, [m.empty_state() for m in self.recurrent],
                              self.rollback_window, log_tokens=not self.kv_prefixes)
        self._states.add(state)
        return state

    def truncate(self, state: SequenceState, length: int) -> None:
        """Forget every position >= length: from a held snapshot, or by replaying the kept
        tokens from the empty state when `length` is older than the rollback window."""
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) \
                or not 0 <= length <= state.length:
            raise ValueError(f"cannot truncate a state of length {state.length} to {length}")
        state.tree = None
        if length == state.length or state.restore(int(length)):
            return
        kept = state.tokens[:length]
        state.reset()
        for begin in range(0, len(kept), REPLAY_CHUNK):
            self.forward(state, kept[begin:begin + REPLAY_CHUNK])

    def forward(self, state: SequenceState, tokens: Sequence[int], rows: Rows = "last",
                features: bool = False) -> Any:
        """Logits [R, vocab] of the tokens appended to the state; with `features=True`, the pair
        (logits, features), features [len(tokens), hidden] float32 being the final hidden state
        (the lm_head input) of every appended row, whatever `rows` is."""
        if features:
            logits, hidden = self.forward_batch([state], [tokens], rows, features=True)
            return logits[0], hidden[0]
        return self.forward_batch([state], [tokens], rows)[0]

    def forward_batch(self, states: Sequence[SequenceState],
                      token_lists: Sequence[Sequence[int]], rows: Rows = "last",
                      features: bool = False,
                      parents: Sequence[Sequence[int] | None] | None = None) -> Any:
        """Append each token list to its own state in one pass and return each sequence's
        logits [R_i, vocab] (with `features=True`, the pair of that list and each sequence's
        features, as `forward` says). Every op but attention and the recurrences runs over the
        rows of all sequences at once and is row invariant, and each sequence reads its own
        state only, so every row has the bits it gets when its sequence runs alone. `parents`
        (rows "all"): per sequence None for a chain or its token tree's parents, as
        forward_tree takes them; that state then holds its tree until commit_tree."""
        if rows not in ("last", "all"):
            raise ParameterError(f"rows must be 'last' or 'all', got {rows!r}")
        if len(states) != len(token_lists) or not states:
            raise ParameterError(f"forward_batch needs one token list per state, got "
                                 f"{len(states)} states and {len(token_lists)} token lists")
        if len({id(state) for state in states}) != len(states):
            raise ParameterError("a state appears twice in one forward_batch")
        trees = list(parents) if parents is not None else [None] * len(states)
        if len(trees) != len(states):
            raise ParameterError(f"forward_batch needs one parents entry per state, got "
                                 f"{len(trees)} for {len(states)} states")
        if any(tree is not None for tree in trees):
            if not self.supports_trees:
                raise ParameterError(self._why_no_trees())
            if rows != "all":
                raise ParameterError("token trees need rows='all'")
        ids, parts = [], []
        for state, tokens, tree in zip(states, token_lists, trees):
            start = state.length
            checked = checked_tokens(tokens, start, self.vocab_size, self.max_context)
            ids.append(checked)
            keep_from = max(0, checked.size - self.rollback_window)
            if tree is None:
                parts.append(SequencePass(state, start, checked.size, keep_from))
                continue
            if len(tree) != checked.size:
                raise ParameterError(f"a token tree needs one parent per token, got "
                                     f"{len(tree)} parents for {checked.size} tokens")
            depths, paths = tree_rows(tree)
            parts.append(SequencePass(state, start, checked.size, keep_from, depths, paths))
        out = self._pass(parts, ids, rows, features)
        for state, part, tree in zip(states, parts, trees):
            if tree is not None:
                state.tree = (part.start, [int(parent) for parent in tree])
        return out

    def _pass(self, parts: list[SequencePass], ids: list[np.ndarray], rows: Rows,
              features: bool) -> Any:
        """One pass over the parts' rows (checked ids); each state then ends after its part.
        Each part's logits, and with `features` also each part's final hidden rows."""
        be, t = self.backend, self.trunk
        for part in parts:
            part.state.cache.reserve_for(part.count)
        ctx = PassContext(be, parts)
        hidden = be.vector(embedding_rows(self.embedding, np.concatenate(ids)))
        if self.embedding_scale is not None:
            hidden = hidden * self.embedding_scale
        if self.plans is not None:
            sequences = [SequenceLayers(p.state.cache.keys, p.state.cache.values, p.start,
                                        p.count, p.depths, p.tree_paths) for p in parts]
            tables = [ctx.rope_rows(table) for table in self.rope_tables]
            hidden = be.run_layers(self.plans, hidden, sequences,
                                   [tables[rope] for rope in self.layer_rope])
        else:
            hidden = run_layers(be, self.layers, hidden, ctx, t.eps)
        for part, checked in zip(parts, ids):
            part.state.commit(part.start, checked, part.keep_from,
                              [part.row_states[m.slot] for m in self.recurrent])
        split, normed = final_rows(be, hidden, [part.count for part in parts], rows,
                                   self.final_norm, t.eps, self.lm_head,
                                   self.keep_hidden or features)
        if self.keep_hidden:
            for part, rows_of_part in zip(parts, normed):
                part.state.log_hidden(part.start, rows_of_part)
        return (split, normed) if features else split

    # -- token trees (supports_trees) --------------------------------------------------------

    @property
    def supports_trees(self) -> bool:
        """Whether forward_tree / commit_tree work: the family declares trees and the backend
        has tree attention."""
        return self.trunk.verifies_trees and \
            bool(getattr(self.backend, "tree_attention", False))

    def _why_no_trees(self) -> str:
        if self.recurrent:
            return f"{self!r} has recurrent layers, which cannot hold a token tree; verify a chain"
        if not self.trunk.verifies_trees:
            return f"{self!r} does not verify token trees; verify a chain"
        return f"{self.backend!r} has no tree attention; verify a chain"

    def forward_tree(self, state: SequenceState, tokens: Sequence[int],
                     parents: Sequence[int], features: bool = False) -> Any:
        """Logits [n, vocab] of a token tree appended to the state in one pass: tokens[0] is
        the root (at position state.length, parent -1), tokens[i] a child of tokens[parents[i]]
        one position further. Row i has the bits of a serial step over the path from the root
        to i. The state then holds the tree (state.tree) until commit_tree or truncate. With
        `features=True`, the pair (logits, features [n, hidden]), row by row alike."""
        out = self.forward_batch([state], [tokens], "all", features, parents=[parents])
        return (out[0][0], out[1][0]) if features else out[0]

    def commit_tree(self, state: SequenceState, path: Sequence[int]) -> None:
        """Keep the path from the root (rows of the last forward_tree) and nothing else: the
        state then holds what serial steps over those tokens leave, bit for bit."""
        if state.tree is None:
            raise ParameterError("commit_tree needs a forward_tree pass first")
        base, parents = state.tree
        check_path(parents, path)
        sources, destinations = path_moves(base, path)
        if sources.size:
            state.cache.move(sources, destinations)
        state.keep_path(base, path)

    # -- KV prefixes (kv_prefixes) -----------------------------------------------------------

    def _check_kv_prefixes(self) -> None:
        if not self.kv_prefixes:
            raise ParameterError(f"{self!r} does not export KV prefixes: its state is more "
                                 "than its KV cache")

    def export_kv(self, state: SequenceState, start: int, end: int
                  ) -> tuple[np.ndarray, np.ndarray]:
        """Host float32 keys and values of positions [start, end) of the state, each
        [layers, kv heads, end - start, head dim]."""
        self._check_kv_prefixes()
        return state.cache.export_rows(start, end)

    def import_kv(self, state: SequenceState, keys: np.ndarray, values: np.ndarray) -> None:
        """Append exported positions to a state that holds the tokens before them; the state
        then holds what computing those positions would leave, bit for bit."""
        self._check_kv_prefixes()
        state.cache.import_rows(keys, values)

    # -- for drafters that read the target's weights and hidden rows -------------------------

    @property
    def head_shape(self) -> HeadShape:
        if self.trunk.head_shape is None:
            raise ParameterError(f"{self!r} does not describe the layer a draft head copies")
        return self.trunk.head_shape

    def embedding_rows(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """float32 rows [len(ids), hidden] of the input embedding table (unscaled)."""
        return embedding_rows(self.embedding, np.asarray(ids, dtype=np.int64).reshape(-1))

    def output_rows(self, ids: Sequence[int] | np.ndarray, stored: bool = False) -> Any:
        """Rows [len(ids), hidden] of the output matrix (lm_head): the logit of token ids[i]
        is features @ output_rows(ids)[i], up to the backend's rounding. float32, or with
        `stored` the rows in the checkpoint's own format (blocks stay blocks), for
        backend.matrix."""
        if self.trunk.output_table is None:
            raise ParameterError(f"{self!r} keeps no host copy of its output matrix")
        return output_rows(self.trunk.output_table(),
                           np.asarray(ids, dtype=np.int64).reshape(-1), stored)

    def state_holding(self, tokens: Sequence[int]) -> SequenceState | None:
        """A live state of this model that holds exactly `tokens`, if any (None for a model
        whose states log no tokens)."""
        for state in list(self._states):
            if state.tokens is not None and state.length == len(tokens) \
                    and state.tokens == list(tokens):
                return state
        return None

    def weights_digest(self) -> str:
        if self._digest is None:
            self._digest = self.trunk.digest()
        return self._digest
