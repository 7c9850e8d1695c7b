"""DecoderModel: the Target for decoder-only transformer families (llama, gemma3, ...).

Invariant: the model is written once against the Backend protocol and never branches on the
backend, so it is exactly as row invariant as the backend's ops: a W-row forward gives each
row the bits of a one-row forward at that position, and a prompt fed in one pass or in chunks
of any size leaves the same cache and the same last-row logits. A family module supplies the
config, where its tensors are (TensorNames) and its layer settings; the weights are checked by
name and shape before anything is built, so a bad checkpoint fails with the tensor named. When
the backend declares fused layers, each layer's plan is built here, once, at load.

A pass asked for `features=True` also returns the final hidden state of every row it appended
(after the final norm: the input of lm_head), with the same row invariance as the logits: a
row's features have the bits of a one-row pass at that position. Asking for them changes no
bit of the logits, since the final norm is row invariant whether it runs over every row or
over the last.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend, DecoderLayer, LayerShape, SequenceLayers
from exactdraft.errors import ParameterError
from exactdraft.formats import QuantizedTensor, stack_rows
from exactdraft.models.blocks import (
    RopeTable,
    SequencePart,
    check_shapes,
    decoder_layer,
    rope_frequencies,
)
from exactdraft.models.cache import KVCache
from exactdraft.models.config import DecoderConfig
from exactdraft.models.target import Capabilities, Rows
from exactdraft.models.token_tree import check_path, path_moves, tree_rows


@dataclass(frozen=True)
class TensorNames:
    """Where a family keeps each weight, as Hugging Face names; "{i}" is the layer index and a
    projection is named without its ".weight" / ".bias" suffix. None: the family has none."""

    embedding: str = "model.embed_tokens.weight"
    final_norm: str = "model.norm.weight"
    lm_head: str = "lm_head.weight"
    attention_norm: str = "model.layers.{i}.input_layernorm.weight"
    q: str = "model.layers.{i}.self_attn.q_proj"
    k: str = "model.layers.{i}.self_attn.k_proj"
    v: str = "model.layers.{i}.self_attn.v_proj"
    output: str = "model.layers.{i}.self_attn.o_proj"
    q_norm: str = "model.layers.{i}.self_attn.q_norm.weight"
    k_norm: str = "model.layers.{i}.self_attn.k_norm.weight"
    post_attention_norm: str | None = None
    mlp_norm: str = "model.layers.{i}.post_attention_layernorm.weight"
    gate: str = "model.layers.{i}.mlp.gate_proj"
    up: str = "model.layers.{i}.mlp.up_proj"
    down: str = "model.layers.{i}.mlp.down_proj"
    post_mlp_norm: str | None = None

    def expected_shapes(self, c: DecoderConfig) -> dict[str, tuple[int, ...]]:
        """Every tensor the config calls for, with its shape."""
        q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        shapes = {self.embedding: (c.vocab_size, c.hidden_size), self.final_norm: (c.hidden_size,)}
        if not c.tie_word_embeddings:
            shapes[self.lm_head] = (c.vocab_size, c.hidden_size)
        for i in range(c.num_layers):
            def name(template: str, suffix: str = "", i: int = i) -> str:
                return template.format(i=i) + suffix

            shapes[name(self.attention_norm)] = (c.hidden_size,)
            shapes[name(self.mlp_norm)] = (c.hidden_size,)
            if c.sandwich_norms:
                shapes[name(self.post_attention_norm)] = (c.hidden_size,)
                shapes[name(self.post_mlp_norm)] = (c.hidden_size,)
            for template, out in ((self.q, q_out), (self.k, kv_out), (self.v, kv_out)):
                shapes[name(template, ".weight")] = (out, c.hidden_size)
                if c.attention_bias:
                    shapes[name(template, ".bias")] = (out,)
            shapes[name(self.output, ".weight")] = (c.hidden_size, q_out)
            if c.attention_output_bias:
                shapes[name(self.output, ".bias")] = (c.hidden_size,)
            if c.qk_norm:
                shapes[name(self.q_norm)] = (c.head_dim,)
                shapes[name(self.k_norm)] = (c.head_dim,)
            for template, shape in ((self.gate, (c.intermediate_size, c.hidden_size)),
                                    (self.up, (c.intermediate_size, c.hidden_size)),
                                    (self.down, (c.hidden_size, c.intermediate_size))):
                shapes[name(template, ".weight")] = shape
                if c.mlp_bias:
                    shapes[name(template, ".bias")] = shape[:1]
        return shapes


def tensor_shape(tensors: Mapping[str, Any], name: str) -> tuple[int, ...]:
    """The logical shape of a tensor, without reading its data when the source can tell."""
    shape_of = getattr(tensors, "shape", None)
    if callable(shape_of):
        return tuple(shape_of(name))
    value = tensors[name]
    return tuple(value.shape) if hasattr(value, "shape") else tuple(np.shape(value))


def final_rows(be: Backend, hidden: Any, counts: Sequence[int], rows: Rows, norm: Any,
               eps: float, lm_head: Any, every_row: bool) -> tuple[list[np.ndarray], Any]:
    """The end of a pass whose parts hold `counts` consecutive rows of `hidden`: each part's
    logits (of its last row, or of all its rows), and with `every_row` each part's normed
    hidden rows on the host (else None). The norm is row invariant, so norming every row
    changes no logit's bits."""
    ends = np.cumsum(counts)
    normed = be.rms_norm(hidden, norm, eps) if every_row else None
    source = hidden if normed is None else normed
    if rows == "last":
        last = (ends - 1).tolist()
        source = be.concatenate([source[r:r + 1] for r in last]) if len(last) > 1 \
            else source[last[0]:last[0] + 1]
        sizes = [1] * len(counts)
    else:
        sizes = list(counts)
    if normed is None:
        source = be.rms_norm(source, norm, eps)
    logits = be.to_host(be.linear(source, lm_head))
    bounds = np.cumsum([0, *sizes])
    split = [logits[bounds[i]:bounds[i + 1]] for i in range(len(counts))]
    if normed is None:
        return split, None
    host = be.to_host(normed)
    return split, [host[end - count:end] for count, end in zip(counts, ends)]


def output_rows(table: Any, ids: np.ndarray, stored: bool) -> Any:
    """Rows `ids` of an output table: float32, or with `stored` blocks stay blocks."""
    if stored and isinstance(table, QuantizedTensor):
        return QuantizedTensor(table.format, np.ascontiguousarray(table.data[ids]),
                               (ids.size, table.shape[1]))
    return embedding_rows(table, ids)


def embedding_rows(table: Any, ids: np.ndarray) -> np.ndarray:
    """float32 rows [len(ids), H] of an embedding table, dequantizing only those rows."""
    take = getattr(table, "take_rows", None)
    if take is not None:
        return take(ids)
    return np.ascontiguousarray(np.asarray(table)[ids], dtype=np.float32)


class DecoderState:
    """One sequence's KV cache; `length` is the number of positions already in it."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        # (base, parents) of the token tree the cache holds past base, until it is committed.
        self.tree: tuple[int, list[int]] | None = None

    @property
    def length(self) -> int:
        return self.cache.length


class DecoderModel:
    """A decoder-only transformer on any Backend; implements the Target protocol."""

    def __init__(self, config: DecoderConfig, tensors: Mapping[str, Any], backend: Backend,
                 max_context: int | None = None, names: TensorNames = TensorNames()) -> None:
        if max_context is not None and (isinstance(max_context, bool) or
                                        not isinstance(max_context, int) or max_context < 1):
            raise ParameterError(f"max_context must be an integer >= 1, got {max_context!r}")
        self.config = c = config
        self.backend = backend
        self.names = names
        self.vocab_size = c.vocab_size
        self.max_context = min(max_context or c.max_position_embeddings,
                               c.max_position_embeddings)
        self.key_block = backend.key_block
        self.eos_token_ids = c.eos_token_ids
        self.arithmetic = backend.arithmetic
        self._expected = names.expected_shapes(c)
        check_shapes(self._expected, lambda name: tensor_shape(tensors, name), c.source)
        self._tensors = tensors
        self._digest: str | None = None
        self.embedding = tensors[names.embedding]  # on the host: rows are taken per pass
        head = names.embedding if c.tie_word_embeddings else names.lm_head
        self.lm_head = backend.matrix(tensors[head])
        self.final_norm = backend.vector(tensors[names.final_norm])
        self.embedding_scale = None if c.embedding_scale is None else \
            backend.vector(np.array([c.embedding_scale], dtype=np.float32))
        global_freq = rope_frequencies(c.head_dim, c.rope_theta, c.rope_scaling)
        self.rope_tables = [RopeTable(global_freq)]
        if c.local_rope_theta is not None:
            self.rope_tables.append(RopeTable(rope_frequencies(c.head_dim, c.local_rope_theta,
                                                               None)))
        # Layer i reads rope table layer_rope[i]: the local one for sliding layers, if any.
        self.layer_rope = [1 if c.local_rope_theta is not None and window else 0
                           for window in c.sliding_windows]
        self.shapes = [LayerShape(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
                                  c.intermediate_size, window, c.rms_norm_eps, c.scale,
                                  c.activation) for window in c.sliding_windows]
        self.layers = [self._layer(tensors, i) for i in range(c.num_layers)]
        self.plans = None
        if backend.fused_layers:
            self.plans = [backend.plan_layer(layer, shape)
                          for layer, shape in zip(self.layers, self.shapes)]

    def __repr__(self) -> str:
        return (f"DecoderModel({self.config.model_type}, {self.config.num_layers} layers, "
                f"backend={self.backend!r})")

    def _layer(self, tensors: Mapping[str, Any], index: int) -> DecoderLayer:
        be, c, n = self.backend, self.config, self.names

        def name(template: str | None, suffix: str = "") -> str | None:
            return None if template is None else template.format(i=index) + suffix

        def vector(template: str | None) -> Any | None:
            full = name(template)
            return be.vector(tensors[full]) if full in self._expected else None

        def matrix(templates: Sequence[str]) -> Any:
            return be.matrix(stack_rows([tensors[name(t, ".weight")] for t in templates]))

        def bias(templates: Sequence[str]) -> Any | None:
            names = [name(t, ".bias") for t in templates]
            if not all(full in self._expected for full in names):
                return None
            return be.vector(np.concatenate([np.asarray(tensors[full], dtype=np.float32)
                                             for full in names]))

        qkv, gate_up = (n.q, n.k, n.v), (n.gate, n.up)
        return DecoderLayer(
            attention_norm=vector(n.attention_norm),
            qkv=matrix(qkv), qkv_bias=bias(qkv),
            output=matrix((n.output,)), output_bias=bias((n.output,)),
            q_norm=vector(n.q_norm), k_norm=vector(n.k_norm),
            post_attention_norm=vector(n.post_attention_norm) if c.sandwich_norms else None,
            mlp_norm=vector(n.mlp_norm),
            gate_up=matrix(gate_up), gate_up_bias=bias(gate_up),
            down=matrix((n.down,)), down_bias=bias((n.down,)),
            post_mlp_norm=vector(n.post_mlp_norm) if c.sandwich_norms else None,
        )

    # -- Target protocol -------------------------------------------------------------------

    def new_state(self) -> DecoderState:
        c = self.config
        return DecoderState(KVCache(self.backend, c.num_layers, c.num_kv_heads, c.head_dim,
                                    self.max_context))

    def truncate(self, state: DecoderState, length: int) -> None:
        state.tree = None
        state.cache.truncate(length)

    def check_tokens(self, tokens: Sequence[int], start: int) -> np.ndarray:
        """Token ids as int64, or a ParameterError naming the first bad id or the overrun."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ParameterError("forward needs at least one token")
        bad = np.flatnonzero((ids < 0) | (ids >= self.vocab_size))
        if bad.size:
            raise ParameterError(
                f"token id {int(ids[bad[0]])} at index {int(bad[0])} is outside the "
                f"vocabulary [0, {self.vocab_size})"
            )
        if start + ids.size > self.max_context:
            raise ParameterError(
                f"{start + ids.size} positions exceed the model's context of {self.max_context}"
            )
        return ids

    def forward(self, state: DecoderState, tokens: Sequence[int], rows: Rows = "last",
                features: bool = False) -> Any:
        """Logits [R, vocab] of the tokens appended to the state; with `features=True`, the pair
        (logits, features), features [len(tokens), hidden] float32 being the final hidden state
        (the lm_head input) of every appended row, whatever `rows` is."""
        if features:
            logits, hidden = self.forward_batch([state], [tokens], rows, features=True)
            return logits[0], hidden[0]
        return self.forward_batch([state], [tokens], rows)[0]

    def forward_batch(self, states: Sequence[DecoderState], token_lists: Sequence[Sequence[int]],
                      rows: Rows = "last", features: bool = False,
                      parents: Sequence[Sequence[int] | None] | None = None) -> Any:
        """Append each token list to its own state in one pass and return each sequence's
        logits [R_i, vocab] (with `features=True`, the pair of that list and each sequence's
        features, as `forward` says). Every op but attention runs over the rows of all
        sequences at once and is row invariant, and each sequence attends to its own cache
        only, so every row has the bits it gets when its sequence runs alone. `parents`
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
                raise ParameterError(f"{self.backend!r} has no tree attention; verify a chain")
            if rows != "all":
                raise ParameterError("token trees need rows='all'")
        ids, parts = [], []
        for state, tokens, tree in zip(states, token_lists, trees):
            start = state.cache.length
            checked = self.check_tokens(tokens, start)
            ids.append(checked)
            if tree is None:
                parts.append(SequencePart(state.cache, start, checked.size))
                continue
            if len(tree) != checked.size:
                raise ParameterError(f"a token tree needs one parent per token, got "
                                     f"{len(tree)} parents for {checked.size} tokens")
            depths, paths = tree_rows(tree)
            parts.append(SequencePart(state.cache, start, checked.size, depths, paths))
        out = self._pass(parts, ids, rows, features)
        for state, part, tree in zip(states, parts, trees):
            if tree is not None:
                state.tree = (part.start, [int(parent) for parent in tree])
        return out

    def _pass(self, parts: list[SequencePart], ids: list[np.ndarray], rows: Rows,
              features: bool = False) -> Any:
        """One pass over the parts' rows (checked ids); each cache then ends after its part.
        Each part's logits, and with `features` also each part's final hidden rows."""
        be, c = self.backend, self.config
        for part in parts:
            part.cache.reserve_for(part.rows)
        all_ids = np.concatenate(ids)
        positions = np.concatenate([part.positions() for part in parts])
        tables = [table.rows(be, positions) for table in self.rope_tables]
        hidden = be.vector(embedding_rows(self.embedding, all_ids))
        if self.embedding_scale is not None:
            hidden = hidden * self.embedding_scale
        if self.plans is not None:
            sequences = [SequenceLayers(part.cache.keys, part.cache.values, part.start,
                                        part.rows, part.depths, part.tree_paths)
                         for part in parts]
            hidden = be.run_layers(self.plans, hidden, sequences,
                                   [tables[rope] for rope in self.layer_rope])
        else:
            for index, layer in enumerate(self.layers):
                cos, sin = tables[self.layer_rope[index]]
                hidden = decoder_layer(be, layer, self.shapes[index], hidden, parts, index,
                                       cos, sin)
        for part in parts:
            part.cache.length = part.start + part.rows
        split, normed = final_rows(be, hidden, [part.rows for part in parts], rows,
                                   self.final_norm, c.rms_norm_eps, self.lm_head, features)
        return (split, normed) if features else split

    # -- token trees (supports_trees) --------------------------------------------------------

    @property
    def supports_trees(self) -> bool:
        """Whether forward_tree / commit_tree exist: the backend declares tree attention."""
        return bool(getattr(self.backend, "tree_attention", False))

    def forward_tree(self, state: DecoderState, tokens: Sequence[int],
                     parents: Sequence[int], features: bool = False) -> Any:
        """Logits [n, vocab] of a token tree appended to the state in one pass: tokens[0] is
        the root (at position state.length, parent -1), tokens[i] a child of tokens[parents[i]]
        one position further. Row i has the bits of a serial step over the path from the root
        to i. The state then holds the tree (state.tree) until commit_tree or truncate. With
        `features=True`, the pair (logits, features [n, hidden]), row by row alike."""
        out = self.forward_batch([state], [tokens], "all", features, parents=[parents])
        return (out[0][0], out[1][0]) if features else out[0]

    def commit_tree(self, state: DecoderState, path: Sequence[int]) -> None:
        """Keep the path from the root (rows of the last forward_tree) and nothing else: the
        state then holds what serial steps over those tokens leave, bit for bit."""
        if state.tree is None:
            raise ParameterError("commit_tree needs a forward_tree pass first")
        base, parents = state.tree
        check_path(parents, path)
        sources, destinations = path_moves(base, path)
        if sources.size:
            state.cache.move(sources, destinations)
        state.tree = None
        state.cache.truncate(base + len(path))

    # -- declared capabilities (exactdraft.models.target.Capabilities) -----------------------

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(batches_sequences=self.batches_sequences,
                            kv_prefixes=self.kv_prefixes, verifies_trees=self.supports_trees,
                            returns_features=self.returns_features)

    # forward_batch gives every row the bits of its sequence alone (tests/models/test_batched).
    batches_sequences = True
    # forward(..., features=True) also returns each appended row's final hidden state.
    returns_features = True
    # A state is its KV cache alone, so a prefix's keys and values can be exported and
    # imported (an exact prefix cache): export_kv / import_kv below.
    kv_prefixes = True

    def export_kv(self, state: DecoderState, start: int, end: int
                  ) -> tuple[np.ndarray, np.ndarray]:
        """Host float32 keys and values of positions [start, end) of the state, each
        [layers, kv heads, end - start, head dim]."""
        return state.cache.export_rows(start, end)

    def import_kv(self, state: DecoderState, keys: np.ndarray, values: np.ndarray) -> None:
        """Append exported positions to a state that holds the tokens before them; the state
        then holds what computing those positions would leave, bit for bit."""
        state.cache.import_rows(keys, values)

    def embedding_rows(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """float32 rows [len(ids), hidden] of the input embedding table (unscaled)."""
        return embedding_rows(self.embedding, np.asarray(ids, dtype=np.int64).reshape(-1))

    def output_rows(self, ids: Sequence[int] | np.ndarray, stored: bool = False) -> Any:
        """Rows [len(ids), hidden] of the output matrix (lm_head): the logit of token ids[i]
        is features @ output_rows(ids)[i], up to the backend's rounding. float32, or with
        `stored` the rows in the checkpoint's own format (blocks stay blocks), for
        backend.matrix."""
        n = self.names
        table = self._tensors[n.embedding if self.config.tie_word_embeddings else n.lm_head]
        return output_rows(table, np.asarray(ids, dtype=np.int64).reshape(-1), stored)

    def weights_digest(self) -> str:
        if self._digest is None:
            digest = hashlib.sha256()
            for name in sorted(self._expected):
                digest.update(name.encode() + b"\0")
                hash_tensor(digest, self._tensors[name])
            self._digest = digest.hexdigest()
        return self._digest


def hash_tensor(digest: Any, value: Any) -> None:
    """Feed a tensor's stored contents (blocks as stored, arrays as float32) with its format
    and shape to a hashlib digest."""
    parts = getattr(value, "digest_parts", None)
    if parts is not None:
        for part in parts():
            digest.update(part)
        return
    array = np.ascontiguousarray(np.asarray(value, dtype=np.float32))
    digest.update(repr(("f32", array.shape)).encode())
    digest.update(memoryview(array).cast("B"))
