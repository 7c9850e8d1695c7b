"""The config of the gemma4 family, whichever file it comes from: each layer's kind, head shape,
KV source and MLP width, and each layer type's rope.

Invariant: a Gemma4Config is complete and consistent once made: one entry per layer in every
per-layer field, and every layer that reads keys and values reads a layer before it, of its own
type, that computes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exactdraft.models.blocks import rope_frequencies
from exactdraft.models.config import ConfigReader

SLIDING, GLOBAL = "sliding_attention", "full_attention"
SLIDING_PATTERN = 6
DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                GLOBAL: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                         "rope_theta": 1000000.0}}


@dataclass(frozen=True)
class LayerRope:
    """One layer type's rope: base, scaling factor and the share of frequencies rotated."""

    theta: float
    factor: float = 1.0
    rotated_share: float = 1.0  # 1: the default rope over the whole head

    def frequencies(self, head_dim: int) -> np.ndarray:
        angles = int(self.rotated_share * head_dim // 2)
        rotated = rope_frequencies(head_dim, self.theta, None)[:angles]
        return np.concatenate([rotated, np.zeros(head_dim // 2 - angles)]) / self.factor


@dataclass(frozen=True)
class Gemma4Config:
    model_type: str
    source: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    sliding: tuple[bool, ...]  # per layer: sliding window (True) or global
    head_dims: tuple[int, ...]  # per layer
    kv_heads: tuple[int, ...]  # per layer
    kv_sources: tuple[int, ...]  # per layer: the layer whose keys and values it attends to
    sliding_window: int
    ropes: tuple[LayerRope, LayerRope]  # sliding, global
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None
    keys_are_values: bool = False  # global layers' values are their keys' projection
    double_wide_mlp: bool = False
    per_layer_size: int = 0
    per_layer_vocab: int = 0
    num_experts: int = 0
    top_k: int = 0
    expert_size: int = 0
    final_logit_softcapping: float | None = None

    def writes_kv(self, layer: int) -> bool:
        return self.kv_sources[layer] == layer

    def mlp_size(self, layer: int) -> int:
        wide = self.double_wide_mlp and not self.writes_kv(layer)
        return self.intermediate_size * (2 if wide else 1)


def kv_sources(reader: ConfigReader, sliding: tuple[bool, ...], shared: int,
               key: str = "num_kv_shared_layers") -> tuple[int, ...]:
    """Each layer itself, except the last `shared` layers: the last earlier layer of their
    type."""
    layers = len(sliding)
    first = layers - shared
    if first < 1:
        raise reader.fail(key, f"({shared}) leaves no layer computing keys "
                          f"among the {layers}")
    sources = list(range(layers))
    for i in range(first, layers):
        earlier = [j for j in range(first) if sliding[j] == sliding[i]]
        if not earlier:
            raise reader.fail(key, f"({shared}) leaves layer {i} no "
                              "earlier layer of its type to read keys from")
        sources[i] = earlier[-1]
    return tuple(sources)
