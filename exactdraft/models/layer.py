"""One layer of a decoder: a token mixer and a feed-forward, each behind its own RMS norm and
residual add, and the same layer as a backend fuses it.

Invariant: Layer.run is the per-op body of every family's layers, written once against the
Backend protocol; fused_layer hands a backend only a layer whose fused form (DecoderLayer's
docstring) computes exactly that body, op for op, so the fused stack gives its bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exactdraft.backends.base import ACTIVATIONS, Backend, DecoderLayer, LayerShape
from exactdraft.models.mixers import AttentionMixer, DenseMLP, PassContext


@dataclass
class Layer:
    """h = h + post_mixer_norm(mixer(rms_norm(h, mixer_norm))), then
    h = h + post_feed_forward_norm(feed_forward(rms_norm(h, feed_forward_norm))); a part given
    as None is skipped (Nemotron-H's layers have one of the two, Gemma's have the post norms)."""

    mixer_norm: Any = None
    mixer: Any = None  # AttentionMixer, GatedDeltaNet or Mamba2: run(backend, x, PassContext)
    feed_forward_norm: Any = None
    feed_forward: Any = None  # DenseMLP or MoEBlock
    post_mixer_norm: Any = None
    post_feed_forward_norm: Any = None

    def run(self, be: Backend, hidden: Any, ctx: PassContext, eps: float) -> Any:
        for norm, part, post in ((self.mixer_norm, self.mixer, self.post_mixer_norm),
                                 (self.feed_forward_norm, self.feed_forward,
                                  self.post_feed_forward_norm)):
            if part is None:
                continue
            out = part.run(be, be.rms_norm(hidden, norm, eps), ctx)
            if post is not None:
                out = be.rms_norm(out, post, eps)
            hidden = hidden + out
        return hidden


def run_layers(be: Backend, layers: Sequence[Layer], hidden: Any, ctx: PassContext,
               eps: float) -> Any:
    for layer in layers:
        hidden = layer.run(be, hidden, ctx, eps)
    return hidden


def fused_layer(layer: Layer, index: int, eps: float, hidden_size: int
                ) -> tuple[DecoderLayer, LayerShape] | None:
    """The layer as a backend fuses it (DecoderLayer's docstring), or None when it is not an
    attention mixer over KV slot `index` with a rope followed by a gated dense feed-forward."""
    a, f = layer.mixer, layer.feed_forward
    if not isinstance(a, AttentionMixer) or not isinstance(f, DenseMLP) or a.gated \
            or a.rope is None or a.kv_slot != index or a.eps != eps \
            or f.activation not in ACTIVATIONS or not f.inner_size \
            or layer.mixer_norm is None or layer.feed_forward_norm is None:
        return None
    return (DecoderLayer(attention_norm=layer.mixer_norm, qkv=a.qkv, qkv_bias=a.qkv_bias,
                         output=a.output, output_bias=a.output_bias, q_norm=a.q_norm,
                         k_norm=a.k_norm, post_attention_norm=layer.post_mixer_norm,
                         mlp_norm=layer.feed_forward_norm, gate_up=f.gate_up,
                         gate_up_bias=f.gate_up_bias, down=f.down, down_bias=f.down_bias,
                         post_mlp_norm=layer.post_feed_forward_norm),
            LayerShape(hidden_size, a.num_heads, a.num_kv_heads, a.head_dim, f.inner_size,
                       a.window, eps, a.scale, f.activation))
