"""DraftHead: an EAGLE-style trained head drafts from the target's own features.

Invariant: the head influences speed only. Each guess is sampled with the target's sampler,
seed, parameters and history at its own position (SAMPLER.md), from the head's logits over its
most probable draft tokens in the full vocabulary (every other token banned; greedy draws take
the argmax of the whole draft vocabulary), so where the head's distribution overlaps the
target's the shared keyed noise makes the guesses agree; the verifier keeps a guess only when
it equals the target's own sample. What the head reads of the target (the final hidden rows of
committed positions, handed over through `observe`, and the target's embedding and output
rows) changes no bit of the target.

How it drafts: it declares `wants_features`, so the Generator's passes return their features
and Decoding hands it those of every committed position (`observe(rows, start)`). When asked
for drafts after a sequence of n tokens it holds the features of positions up to n - 2; its
own rows for positions it has not computed yet are caught up from those (row p reads token p
and the feature of p - 1), the row of position n - 1 gives the first guess, and each further
guess feeds the head's own output row back with the guess just made, one position on. Before
catching up, its cache is cut back to the rows computed from committed tokens and the target's
features, so speculative rows never outlive a proposal. Without features (a pass that did not
return them, as the engine's) it proposes nothing, a plain serial step.

Its matrix products run on the target's backend (`backend.matrix` / `backend.linear`), the
head's matrices in q8_0 blocks by default and the output rows in the target's own format: on
the CPU backend a numpy or torch product would start a second pool of threads that spins on
the cores the target's kernels use. On a backend with fused decoder layers (the CPU kernels)
the head's block is one call of the target's layer kernel (FusedBlock); elsewhere the rest is
numpy (head_model.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from exactdraft.backends.base import DecoderLayer, LayerShape, SequenceLayers
from exactdraft.drafters.base import DraftContext, DraftTree
from exactdraft.drafters.head_model import (
    HeadCache,
    HeadWeights,
    head_rows,
    layer_of,
    matrices,
    numpy_linear,
    read_config,
    rope_angles,
)
from exactdraft.errors import CheckpointError, ParameterError
from exactdraft.formats.table import QuantizedTensor
from exactdraft.models.cache import KVCache
from exactdraft.models.target import capabilities_of

# The head's guess is its keyed draw among its this many most probable tokens (the rest of
# its mass rarely holds the target's sample, and the draw's work grows with the candidates).
DRAW_CANDIDATES = 64
HEADS_FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "data", "heads")
FORMATS = ("q8_0", "f32", "numpy")


def quantize_q8_0(matrix: np.ndarray) -> QuantizedTensor:
    """q8_0 blocks of a float32 matrix [N, K] (K a multiple of 32): per 32 weights an f16
    scale d = max |w| / 127 and int8 codes round(w / d)."""
    rows, depth = matrix.shape
    blocks = matrix.reshape(rows, depth // 32, 32).astype(np.float32)
    scale = (np.abs(blocks).max(axis=-1, keepdims=True) / 127).astype(np.float16)
    wide = scale.astype(np.float32)
    codes = np.round(np.divide(blocks, wide, out=np.zeros_like(blocks), where=wide > 0))
    data = np.concatenate([scale.view(np.uint8),
                           np.clip(codes, -127, 127).astype(np.int8).view(np.uint8)], axis=-1)
    return QuantizedTensor("q8_0", data.reshape(rows, -1), (rows, depth))


class FusedBlock:
    """head_rows on a backend with fused decoder layers (the CPU kernels): fc, then the head's
    block as one call of the target's own layer kernel (a pre-norm attention + gated SiLU MLP
    layer is exactly the head's block), then the final norm, with the head's keys and values
    in the backend's KV cache. The same computation as head_rows in the backend's arithmetic:
    it changes drafts' speed, not what the verifier keeps."""

    def __init__(self, backend: Any, weights: HeadWeights, linear: BackendLinear,
                 max_context: int) -> None:
        c, t, be = weights.config, weights.tensors, backend
        self.backend, self.config, self.linear = be, c, linear
        self.max_context = max_context
        m = linear.matrices
        layer = DecoderLayer(
            attention_norm=be.vector(t["attention_norm.weight"]), qkv=m["qkv"], qkv_bias=None,
            output=m["o"], output_bias=None, q_norm=None, k_norm=None,
            post_attention_norm=None, mlp_norm=be.vector(t["mlp_norm.weight"]),
            gate_up=m["gate_up"], gate_up_bias=None, down=m["down"], down_bias=None,
            post_mlp_norm=None)
        shape = LayerShape(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim,
                           c.intermediate_size, 0, c.rms_norm_eps, c.head_dim ** -0.5, "silu")
        self.layer = layer  # the plan holds the addresses of its arrays: they must live on
        self.plan = be.plan_layer(layer, shape)
        self.final_norm = be.vector(t["final_norm.weight"])

    def new_cache(self) -> KVCache:
        return KVCache(self.backend, 1, self.config.num_kv_heads, self.config.head_dim,
                       self.max_context)

    def rows(self, cache: KVCache, embeddings: np.ndarray, features: np.ndarray,
             positions: np.ndarray) -> np.ndarray:
        """head_rows' output rows [n, hidden], the block's keys and values appended to cache."""
        be, c = self.backend, self.config
        x = self.linear.apply("fc", be.vector(
            np.concatenate([embeddings, features], axis=1).astype(np.float32)))
        cos, sin = rope_angles(positions, c.head_dim, c.rope_theta)
        n = embeddings.shape[0]
        cache.reserve_for(n)
        hidden = be.run_layers([self.plan], x, [SequenceLayers(cache.keys, cache.values,
                                                               cache.length, n)],
                               [(be.vector(cos), be.vector(sin))])
        cache.length += n
        return be.to_host(be.rms_norm(hidden, self.final_norm, c.rms_norm_eps))


class BackendLinear:
    """head_rows' matrix products on a backend: name -> backend.matrix, x @ matrix.T."""

    def __init__(self, backend: Any, stacked: dict[str, Any]) -> None:
        self.backend = backend
        self.matrices = {name: backend.matrix(value) for name, value in stacked.items()}

    def __call__(self, name: str, x: np.ndarray) -> np.ndarray:
        be = self.backend
        return be.to_host(self.apply(name, be.vector(x)))

    def apply(self, name: str, x: Any) -> Any:
        """x (on the backend) @ matrix.T, left on the backend."""
        return self.backend.linear(x, self.matrices[name])


def bundled_head_for(target: Any) -> str:
    """The folder of the head shipped in exactdraft/data/heads for this target."""
    digest = target.weights_digest()
    names = sorted(os.listdir(HEADS_FOLDER)) if os.path.isdir(HEADS_FOLDER) else []
    for name in names:
        folder = os.path.join(HEADS_FOLDER, name)
        try:
            if read_config(folder).target_digest == digest:
                return folder
        except CheckpointError:
            continue
    raise CheckpointError(f"no draft head is bundled for {target!r} (weights digest "
                          f"{digest[:12]}; bundled: {', '.join(names) or 'none'}); train one "
                          "with `exactdraft train-drafter MODEL --out DIR`")


class DraftHead:
    """Drafter protocol plus `observe`; build with from_pretrained or DraftHead(target,
    weights), weights being a HeadWeights trained for this target."""

    wants_features = True

    def __init__(self, target: Any, weights: HeadWeights, max_draft: int = 4,
                 source: str = "<in memory>", weights_format: str = "q8_0",
                 min_confidence: float = 0.0, tree_width: int = 1) -> None:
        """`weights_format`: how the head's matrices are multiplied: "q8_0" blocks or "f32"
        on the target's backend, or "numpy" (float32, the reference arithmetic).
        `min_confidence`: the chain stops before a guess that would bring the product of the
        guesses' head probabilities (softmax of its logits) below this (0: never).
        `tree_width` > 1: proposals are DraftTrees of at most max_draft nodes: at each depth
        the head's keyed guess (listed first, and the one the chain continues from) and up to
        tree_width - 1 of the head's next most probable tokens as alternatives."""
        if isinstance(tree_width, bool) or not isinstance(tree_width, int) or tree_width < 1:
            raise ParameterError(f"tree_width must be an integer >= 1, got {tree_width!r}")
        self.tree_width = tree_width
        if isinstance(max_draft, bool) or not isinstance(max_draft, int) or max_draft < 1:
            raise ParameterError(f"max_draft must be an integer >= 1, got {max_draft!r}")
        if isinstance(min_confidence, bool) or not isinstance(min_confidence, (int, float)) \
                or not 0.0 <= min_confidence < 1.0:
            raise ParameterError(f"min_confidence must lie in [0, 1), got {min_confidence!r}")
        self.min_confidence = float(min_confidence)
        if weights_format not in FORMATS:
            raise ParameterError(f"weights_format must be one of {FORMATS}, got "
                                 f"{weights_format!r}")
        if not capabilities_of(target).returns_features:
            raise ParameterError(f"{target!r} cannot return its features (DecoderModel and "
                                 "HybridModel can); a draft head needs them")
        c = weights.config
        digest = target.weights_digest()
        if c.target_digest != digest:
            trained_for = c.target_name or "unnamed"
            raise CheckpointError(
                f"{source}: this draft head was trained for another target ({trained_for}, "
                f"weights digest {c.target_digest[:12]}), not for {target!r} (digest "
                f"{digest[:12]}); train one for it with `exactdraft train-drafter`")
        if c.target_vocab_size != target.vocab_size or \
                c.hidden_size != layer_of(target).hidden_size:
            raise CheckpointError(f"{source}: the head's shapes do not fit {target!r}")
        self.target = target
        self.weights = weights
        self.max_draft = max_draft
        self.vocab_size = target.vocab_size
        self.source = source
        self.draft_ids = weights.tensors["draft_ids"]
        self.block: FusedBlock | None = None  # the block in one kernel call, where it can be
        if weights_format == "numpy":
            self.linear = numpy_linear(weights)
            output = target.output_rows(self.draft_ids)
            self.logits = lambda row: row @ output.T
        else:
            stacked: dict[str, Any] = matrices(weights)
            if weights_format == "q8_0":  # blocks of 32 along K, where K allows
                stacked = {name: quantize_q8_0(value) if value.shape[1] % 32 == 0 else value
                           for name, value in stacked.items()}
            # The target's output rows of the draft vocabulary, in the target's own format.
            stacked["output"] = target.output_rows(self.draft_ids, stored=True)
            self.linear = BackendLinear(target.backend, stacked)
            self.logits = lambda row: self.linear("output", row)
            if target.backend.fused_layers:
                self.block = FusedBlock(target.backend, weights, self.linear,
                                        target.max_context)
        self._context: DraftContext | None = None
        self._reset_features(0)

    def __repr__(self) -> str:
        c = self.weights.config
        width = f", tree_width={self.tree_width}" if self.tree_width > 1 else ""
        return (f"DraftHead({c.draft_vocab_size} draft tokens, max_draft={self.max_draft}"
                f"{width}, {os.path.basename(self.source.rstrip(os.sep)) or self.source})")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str] | None, target: Any,
                        max_draft: int = 4, weights_format: str = "q8_0",
                        min_confidence: float = 0.0, tree_width: int = 1) -> DraftHead:
        """The head stored in folder `path` (config.json + head.safetensors), for `target`;
        None: the head bundled with exactdraft for this target (SmolLM2 and Gemma 3 270M have
        one). A head trained for other weights raises CheckpointError."""
        folder = bundled_head_for(target) if path is None else os.fspath(path)
        return cls(target, HeadWeights.load(folder), max_draft=max_draft, source=folder,
                   weights_format=weights_format, min_confidence=min_confidence,
                   tree_width=tree_width)

    def save_pretrained(self, path: str | os.PathLike[str], dtype: str = "float16") -> None:
        self.weights.save(path, dtype)

    # -- features from the target ------------------------------------------------------------

    def _reset_features(self, start: int) -> None:
        self._features = np.zeros((256, self.weights.config.hidden_size), dtype=np.float32)
        self._feature_start = start  # the position of self._features[0]
        self._held = 0  # features held: positions [start, start + held)
        self._cache: Any = self.block.new_cache() if self.block is not None else \
            HeadCache(self.weights.config)
        self._tokens: list[int] = []  # tokens of the head's real rows, from position start + 1
        self._last = None  # the output of the last real row

    def observe(self, features: Any, start: int) -> None:
        """The target's features of positions start, start + 1, ... (rows [n, hidden])."""
        rows = np.asarray(features, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[1] != self.weights.config.hidden_size:
            raise ParameterError(f"features must be [rows, {self.weights.config.hidden_size}], "
                                 f"got shape {rows.shape}")
        if not self._feature_start <= start <= self._feature_start + self._held:
            self._reset_features(start)  # a gap: start over from here
        keep = start - self._feature_start
        end = keep + len(rows)
        if end > len(self._features):
            grown = np.zeros((max(end, 2 * len(self._features)), rows.shape[1]), np.float32)
            grown[:keep] = self._features[:keep]
            self._features = grown
        self._features[keep:end] = rows
        self._held = end
        if len(self._tokens) > keep:  # rows after `start` read features just replaced
            del self._tokens[keep:]
            self._last = None

    # -- Drafter protocol ---------------------------------------------------------------------

    def begin(self, prompt: Sequence[int], context: DraftContext) -> None:
        self._context = context
        self._reset_features(0)

    def propose(self, sequence: Sequence[int], limit: int) -> list[int] | DraftTree:
        limit = min(limit, self.max_draft, self.target.max_context - len(sequence))
        context, n = self._context, len(sequence)
        first = self._feature_start + 1  # the position of the head's first row
        if limit <= 0 or context is None or n - 1 < first or \
                self._feature_start + self._held < n - 1:
            return []  # no features of positions up to n - 2
        try:
            return self._draft(sequence, limit, context, first)
        except BaseException:
            self._tokens, self._last = [], None
            raise

    def _draft(self, sequence: Sequence[int], limit: int, context: DraftContext,
               first: int) -> list[int] | DraftTree:
        n = len(sequence)
        # The head's rows that still hold: those of committed tokens (and target features).
        real = len(self._tokens)
        if real > n - first or self._tokens != list(sequence[first:first + real]):
            real = 0
            while real < min(len(self._tokens), n - first) and \
                    self._tokens[real] == sequence[first + real]:
                real += 1
        if real < n - first or self._last is None:
            real = min(real, n - first - 1)  # at least the last row is recomputed then
            self._truncate(real)
            new = list(sequence[first + real:n])
            self._last = self._rows(self.target.embedding_rows(new),
                                    self._features[real:real + len(new)],
                                    np.arange(first + real, n))[-1:]
            self._tokens[real:] = new
        self._truncate(n - first)
        history = list(sequence)
        # Every node and its parent; with tree_width 1 the nodes are a chain of keyed guesses.
        nodes: list[int] = []
        parents: list[int] = []
        chain_end = -1  # the keyed guess the next depth hangs from
        row = self._last
        confidence = 1.0

        def proposal() -> list[int] | DraftTree:
            return DraftTree(tuple(nodes), tuple(parents)) if self.tree_width > 1 else nodes

        while True:
            logits = self.logits(row)[0]
            # Greedy draws need no cut: the argmax over the whole draft vocabulary is as cheap.
            top = most_probable(logits) if context.params.temperature > 0 or \
                self.tree_width > 1 else slice(None)
            token = context.sampler.sample_among(logits[top], self.draft_ids[top],
                                                 self.vocab_size, context.params,
                                                 pos=len(history), history=history,
                                                 n_prompt=context.n_prompt)
            if self.min_confidence > 0:
                exp = np.exp(logits - logits.max())
                index = int(np.searchsorted(self.draft_ids, token))
                inside = index < len(self.draft_ids) and self.draft_ids[index] == token
                confidence *= float(exp[index] / exp.sum()) if inside else 0.0
                if confidence < self.min_confidence:
                    return proposal()
            # The guess, then its alternatives, all children of the guess above.
            guess = len(nodes)
            for node in [token, *self._alternatives(logits, top, token)][:limit - len(nodes)]:
                nodes.append(node)
                parents.append(chain_end)
            chain_end = guess
            if len(nodes) == limit:
                return proposal()
            row = self._rows(self.target.embedding_rows([token]), row,
                             np.array([len(history)]))
            history.append(token)

    def _rows(self, embeddings: np.ndarray, features: np.ndarray,
              positions: np.ndarray) -> np.ndarray:
        if self.block is not None:
            return self.block.rows(self._cache, embeddings, features, positions)
        return head_rows(self.weights, self._cache, embeddings, features, positions,
                         self.linear)

    def _truncate(self, length: int) -> None:
        self._cache.truncate(min(length, self._cache.length))

    def _alternatives(self, logits: np.ndarray, top: Any, token: int) -> list[int]:
        """Up to tree_width - 1 target ids other than `token` among `top` (indices of the
        head's most probable tokens) that the head finds most probable at this position, most
        probable first (ties: the lower id); none for chains."""
        if self.tree_width == 1:
            return []
        ranked = top[np.lexsort((top, -logits[top]))][:self.tree_width]
        return [i for i in self.draft_ids[ranked].tolist() if i != token][:self.tree_width - 1]

    def accepted(self, proposed: int, accepted: int) -> None:
        pass


def most_probable(logits: np.ndarray, count: int = DRAW_CANDIDATES) -> np.ndarray:
    """Indices, ascending, of the `count` largest `logits` (ties at the cut: any of them)."""
    n = len(logits)
    if n <= count:
        return np.arange(n)
    # The count-th largest of about 4 * count block maxima bounds the cut from below (count
    # blocks each hold an entry at or above it), so only the few entries above it are ranked:
    # ranking all 8192 of a draft vocabulary costs more than the draw it saves.
    size = max(1, n // (4 * count))
    blocks = n // size
    maxima = logits[:blocks * size].reshape(blocks, size).max(axis=1)
    near = np.flatnonzero(logits >= np.partition(maxima, blocks - count)[blocks - count])
    cut = len(near) - count
    return np.sort(near[np.argpartition(logits[near], cut)[cut:]])
