"""The attention layers of the hybrid families split by heads across tensor-parallel ranks, as
heads.py splits a dense decoder's: each rank computes q, (the output gate,) k and v of its own
heads, attends with them over its own part of the KV cache, and the ranks gather the attended
rows (whole heads, in head order) before the output projection.

Invariant: TP=N writes the bits TP=1 writes, by heads.py's argument: rank r owns KV heads
[r Hkv/N, (r+1) Hkv/N) and the query heads that read them; each of its q, gate, k, v rows is a
whole dot product (sharding.py's rule); q/k norms, rope, attention and the output gate read
one head at a time with TP=1's code and kernels; the gather is a copy. The rank's rows are
taken from the layer's weights as the family's own loader (models/mixers.py's load_attention)
stores them, so row permutations for partial rope are TP=1's. Used when N divides the KV heads;
otherwise every rank attends with every head from the gathered projection.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from exactdraft.formats.table import stack_rows
from exactdraft.models.mixers import AttentionMixer, load_attention
from exactdraft.models.tensors import TensorReader
from exactdraft.parallel.heads import GatheredInput, HeadRange
from exactdraft.parallel.recurrent_heads import Unpacked
from exactdraft.parallel.sharding import weight_rows


def stored_attention(checkpoint: Any, prefix: str, mixer: AttentionMixer) -> AttentionMixer:
    """The attention layer whose weights live at `prefix`, with its weights as load_attention
    stacks them (unpacked)."""
    c = checkpoint.config
    reader = TensorReader(checkpoint.tensors, c.source)
    rotary = getattr(c, "rotary_dim", None) if mixer.rope is not None else None
    return load_attention(Unpacked(), reader, prefix,
                          hidden=c.hidden_size, heads=mixer.num_heads,
                          kv_heads=mixer.num_kv_heads, head_dim=mixer.head_dim,
                          kv_slot=mixer.kv_slot, eps=mixer.eps, rope=mixer.rope,
                          rotary_dim=rotary, qk_norm=mixer.q_norm is not None,
                          gated=mixer.gated, bias=mixer.qkv_bias is not None,
                          window=mixer.window)


def split_attention(mixer: AttentionMixer, stored: AttentionMixer, heads: HeadRange,
                    backend: Any) -> AttentionMixer:
    """Rank heads.rank's part of an attention mixer: its heads' rows of q (the gate), k, v
    computed locally, the output projection gathering the heads' attended rows first."""
    (q0, q1), (k0, k1) = heads.q_rows(), heads.kv_rows()
    q_size = mixer.num_heads * mixer.head_dim
    kv_size = mixer.num_kv_heads * mixer.head_dim
    first = 2 * q_size if mixer.gated else q_size  # where k starts
    rows = [(q0, q1), *([(q_size + q0, q_size + q1)] if mixer.gated else []),
            (first + k0, first + k1), (first + kv_size + k0, first + kv_size + k1)]
    backend.forget(mixer.qkv)  # replaced by this rank's heads
    qkv = backend.local_matrix(stack_rows([weight_rows(stored.qkv, a, b) for a, b in rows]))
    bias = None if stored.qkv_bias is None else backend.vector(np.concatenate(
        [np.asarray(stored.qkv_bias, np.float32)[a:b] for a, b in rows]))
    widths = [heads.heads * heads.head_dim] * heads.world_size
    return dataclasses.replace(mixer, qkv=qkv, qkv_bias=bias,
                               output=GatheredInput(mixer.output, widths),
                               num_heads=heads.heads, num_kv_heads=heads.kv_heads)


def split_attention_layers(model: Any, checkpoint: Any, backend: Any, attention_prefix: Any
                           ) -> bool:
    """Split every attention layer of a hybrid DecoderModel by heads, in place, when the ranks
    divide its KV heads (the KV cache then holds the rank's heads); False when they do not.
    The family's `attention_prefix(reader, layer)` says where each layer's weights live."""
    rank, world_size = backend.group.rank, backend.group.world_size
    attention = [(i, layer) for i, layer in enumerate(model.layers)
                 if type(layer.mixer) is AttentionMixer]
    if not attention or world_size < 2:
        return False
    first = attention[0][1].mixer
    if any(layer.mixer.num_kv_heads != first.num_kv_heads or
           layer.mixer.num_heads != first.num_heads for _, layer in attention) or \
            first.num_kv_heads % world_size or first.num_heads % first.num_kv_heads:
        return False
    heads = HeadRange(rank, world_size, first.num_heads, first.num_kv_heads, first.head_dim)
    reader = TensorReader(checkpoint.tensors, checkpoint.config.source)
    for index, layer in attention:
        stored = stored_attention(checkpoint, attention_prefix(reader, index), layer.mixer)
        layer.mixer = split_attention(layer.mixer, stored, heads, backend)
    model.trunk = dataclasses.replace(model.trunk, num_kv_heads=heads.kv_heads)
    return True
