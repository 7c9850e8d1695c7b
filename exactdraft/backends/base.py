"""The array-backend protocol the transformer is written against, and the backend registry.

Invariant (INVARIANCE.md): every op here is row invariant. For a pass of M rows, row r's output
bits equal the bits that row gets when it is computed alone, whatever the other rows hold and
wherever r sits in the pass. For attention a row is one query position; its result depends only
on the keys up to its own position (inside its sliding window), never on how many keys the cache
holds beyond it or how many other queries share the pass.

Backend arrays support `.shape`, `.reshape(...)`, row slicing `x[a:b]` and `+`; everything that
computes goes through the methods below so that a backend can keep the contract with kernels of
its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from exactdraft.errors import BackendError

Array = Any

DTYPES = ("float32", "bfloat16", "float16")
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass
class DecoderLayer:
    """One decoder layer's weights, each prepared by the backend (`matrix` / `vector`).

    The layer computes, for hidden rows h at positions p:
        x = rms_norm(h, attention_norm); q, k, v = x qkv^T (+ qkv_bias)
        q, k = rms_norm per head (q_norm, k_norm), then rope; keys and values enter the cache
        a = attention(q) output^T (+ output_bias); a = rms_norm(a, post_attention_norm)
        h = h + a; x = rms_norm(h, mlp_norm)
        m = act(x gate_up^T (+ gate_up_bias)) down^T (+ down_bias); m = rms_norm(m, post_mlp_norm)
        h = h + m
    where a norm given as None is skipped and act is the gated activation of the LayerShape.
    """

    attention_norm: Array
    qkv: Array
    qkv_bias: Array | None
    output: Array
    output_bias: Array | None
    q_norm: Array | None
    k_norm: Array | None
    post_attention_norm: Array | None
    mlp_norm: Array
    gate_up: Array
    gate_up_bias: Array | None
    down: Array
    down_bias: Array | None
    post_mlp_norm: Array | None


@dataclass(frozen=True)
class SequenceRows:
    """One sequence's rows in a pass: `rows` rows whose keys and values go into slots start ..
    of its buffers [Hkv, capacity, D]. A chain's rows sit at the positions of their slots; a
    token tree's (tree_attention backends only) row r sits at position start + depths[r] and
    attends to the keys before start and to its path, tree_paths[r, d] being the row of its
    ancestor at depth d."""

    keys: Array
    values: Array
    start: int
    rows: int
    depths: np.ndarray | None = None  # [rows] int32
    tree_paths: np.ndarray | None = None  # [rows, rows] int32


@dataclass(frozen=True)
class SequenceLayers:
    """One sequence's rows in a pass through a whole stack of layers: SequenceRows with one
    keys and one values buffer per layer."""

    keys: Sequence[Array]
    values: Sequence[Array]
    start: int
    rows: int
    depths: np.ndarray | None = None  # [rows] int32
    tree_paths: np.ndarray | None = None  # [rows, rows] int32

    def at(self, layer: int) -> SequenceRows:
        return SequenceRows(self.keys[layer], self.values[layer], self.start, self.rows,
                            self.depths, self.tree_paths)


@dataclass(frozen=True)
class LayerShape:
    """The sizes and settings of one decoder layer."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    window: int  # 0: full attention; W: keys j with p - j < W
    eps: float
    attention_scale: float
    activation: str  # one of ACTIVATIONS


@runtime_checkable
class Backend(Protocol):
    """The ops a decoder-only transformer needs, each row invariant."""

    name: str
    device: str
    dtype: str
    # Keys are reduced in blocks of this many absolute positions; KV buffers are allocated in
    # multiples of it so that a row's last, partial block can always be read at full width.
    key_block: int

    def matrix(self, weight: Any) -> Array:
        """Prepare a weight matrix [N, K] (a float32 numpy array or a quantized weight)."""

    def vector(self, values: np.ndarray) -> Array:
        """Upload a float32 numpy array (norm weights, biases, tables) in the compute dtype."""

    def embedding(self, table: Array, token_ids: np.ndarray) -> Array:
        """Rows of `table` for integer ids [M] -> [M, H]."""

    def linear(self, x: Array, weight: Array, bias: Array | None = None) -> Array:
        """x [M, K] times weight^T -> [M, N], plus bias; K order fixed by the weight alone."""

    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        """Root-mean-square norm over the last dimension of x [M, K]."""

    def rope(self, x: Array, cos: Array, sin: Array) -> Array:
        """Rotary embedding (rotate-half layout) of x [M, H, D] with per-row cos/sin [M, D/2]."""

    def silu_mul(self, gate_up: Array) -> Array:
        """silu(gate) * up for gate_up [M, 2I] holding gate then up -> [M, I]."""

    def gelu_mul(self, gate_up: Array) -> Array:
        """gelu_tanh(gate) * up for gate_up [M, 2I] holding gate then up -> [M, I], where
        gelu_tanh(x) = x / 2 (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""

    def kv_buffer(self, num_kv_heads: int, capacity: int, head_dim: int,
                  previous: Array | None = None) -> Array:
        """A zero-filled key or value buffer [num_kv_heads, capacity, head_dim], holding the
        contents of `previous` (a smaller buffer) in its first positions when one is given."""

    def kv_write(self, buffer: Array, start: int, rows: Array) -> Array:
        """Store rows [M, num_kv_heads, head_dim] at positions start.. and return the buffer."""

    def attention(self, q: Array, keys: Array, values: Array, positions: np.ndarray,
                  window: int, scale: float) -> Array:
        """Causal grouped-query attention of q [M, Hq, D] at absolute `positions` [M] over the
        buffers [Hkv, capacity, D]; a query at p sees keys j <= p (and p - j < window if
        window > 0). Returns [M, Hq, D]. Backends with tree_attention also take
        `tree_paths` [M, M] int32: the rows are a token tree whose root (row 0) sits at
        positions[0], and row r sees the key of position positions[0] + d in the slot of row
        tree_paths[r, d] (SequenceRows). Backends with attention_sinks also take `sinks`, a
        float32 numpy array [Hq] of logits that join each row's softmax denominator with no
        value, folded in before the keys (backends/sinks.py)."""

    # Whether `attention` takes tree_paths and `kv_move` exists: token trees verified in one
    # pass, each row with the bits of a serial step over its own path.
    tree_attention: bool
    # `attention_sinks` (optional, absent means False): whether `attention` takes sinks
    # (gpt-oss); a model with sinks refuses a backend without (backends/sinks.py).

    def kv_move(self, buffer: Array, sources: np.ndarray, destinations: np.ndarray) -> Array:
        """Copy positions `sources` of a key or value buffer to `destinations` (tree_attention
        only: a verified path's keys move to the positions they stand for)."""

    def to_host(self, x: Array) -> np.ndarray:
        """A float32 numpy copy (or view) of x."""

    def concatenate(self, parts: list[Array]) -> Array:
        """The parts' rows, in order, as one array (a copy: no arithmetic)."""

    # -- declared capabilities -------------------------------------------------------------

    # Whether plan_layer / run_layer exist: a whole decoder layer in one call, with the bits
    # of the per-op body (DecoderLayer's docstring) on this backend.
    fused_layers: bool
    # The arithmetic contract the backend's bits follow, e.g. "cpu-canonical-1": two machines
    # whose backends name the same contract give the same bits for the same weights and inputs.
    arithmetic: str

    def plan_layer(self, layer: DecoderLayer, shape: LayerShape) -> Any:
        """What run_layer needs for this layer, built once at load (fused_layers only)."""

    def run_layer(self, plan: Any, hidden: Array, sequences: list[SequenceRows], cos: Array,
                  sin: Array) -> Array:
        """The decoder layer (fused_layers only) for the rows of one or more sequences, in the
        order of `sequences`: writes each sequence's keys and values into its buffers and
        returns the new hidden rows, each with the bits it gets with its sequence alone."""

    def run_layers(self, plans: Sequence[Any], hidden: Array, sequences: list[SequenceLayers],
                   tables: Sequence[tuple[Array, Array]]) -> Array:
        """run_layer for every plan in turn (fused_layers only), layer i with tables[i] as its
        (cos, sin) and sequence.at(i) as each sequence's buffers: the same bits in one call."""


def dense_matrix(weight: Any) -> np.ndarray:
    """A weight as a float32 [N, K] numpy array (quantized weights dequantize), or an error."""
    dense = np.array(weight, dtype=np.float32)
    if dense.ndim != 2:
        raise BackendError(f"a weight matrix must be 2-D, got shape {dense.shape}")
    return dense


class WithoutTreeAttention:
    """For backends that declare no tree attention: token trees are cut to chains for them."""

    tree_attention = False

    def kv_move(self, buffer: Array, sources: np.ndarray, destinations: np.ndarray) -> Array:
        raise BackendError(f"{self!r} has no tree attention (tree_attention is False)")


class WithoutFusedLayers:
    """For backends that declare no fused layers: the model runs the per-op body."""

    fused_layers = False

    def plan_layer(self, layer: DecoderLayer, shape: LayerShape) -> Any:
        raise BackendError(f"{self!r} has no fused decoder layer (fused_layers is False)")

    def run_layer(self, plan: Any, hidden: Array, sequences: list[SequenceRows], cos: Array,
                  sin: Array) -> Array:
        raise BackendError(f"{self!r} has no fused decoder layer (fused_layers is False)")

    def run_layers(self, plans: Sequence[Any], hidden: Array, sequences: list[SequenceLayers],
                   tables: Sequence[tuple[Array, Array]]) -> Array:
        raise BackendError(f"{self!r} has no fused decoder layer (fused_layers is False)")
