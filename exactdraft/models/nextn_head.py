"""The MTP layers of DeepSeek-V3 and GLM-4.5 checkpoints (`num_nextn_predict_layers`, stored as
the layers after the trunk) as an MTPHead (mtp_head.py); with latent attention, an MTPHead
whose state holds a LatentCache.

These checkpoints store the head's parts beside its decoder layer: enorm (the embedding's
norm), hnorm (the hidden row's norm), eh_proj (fc [H, 2H], embedding half first),
shared_head.norm (the final norm) and shared_head.head (its lm_head; the target's where
absent). Only the first MTP layer is used: an MTPHead holds one set of those parts, and the
published checkpoints ship one.

Invariant: as for every MTPHead, the head only proposes drafts; the verifier keeps a draft only
where it equals the target's own sample.
"""

from __future__ import annotations

from typing import Any

from exactdraft.models.latent_attention import LatentCache
from exactdraft.models.layer import Layer
from exactdraft.models.mixers import norm_vector
from exactdraft.models.mtp_head import MTPHead
from exactdraft.models.state import SequenceState
from exactdraft.models.tensors import TensorReader


class LatentMTPHead(MTPHead):
    """An MTPHead over latent attention: num_kv_heads 1, head_dim the cache width."""

    def new_state(self) -> SequenceState:
        cache = LatentCache(self.backend, len(self.layers), 1, self.head_dim, self.max_context)
        return SequenceState(cache, [], 1)


def nextn_head(be: Any, reader: TensorReader, prefix: str, layer: Layer, embedding: Any,
               lm_head: Any, *, hidden: int, vocab_size: int, eps: float, num_kv_heads: int,
               head_dim: int, max_context: int, latent: bool = False) -> MTPHead:
    """The head of the MTP layer stored under `prefix` (its decoder layer already built, with
    its cache in slot 0); `lm_head` is the target's, used where shared_head.head is absent."""
    own_head = prefix + "shared_head.head.weight"
    return (LatentMTPHead if latent else MTPHead)(
        backend=be, fc=be.matrix(reader.get(prefix + "eh_proj.weight", (hidden, 2 * hidden))),
        embedding_norm=norm_vector(be, reader, prefix + "enorm.weight", hidden),
        hidden_norm=norm_vector(be, reader, prefix + "hnorm.weight", hidden),
        final_norm=norm_vector(be, reader, prefix + "shared_head.norm.weight", hidden),
        layers=[layer], embedding=embedding,
        lm_head=be.matrix(reader.get(own_head, (vocab_size, hidden)))
        if reader.has(own_head) else lm_head,
        eps=eps, vocab_size=vocab_size, num_kv_heads=num_kv_heads, head_dim=head_dim,
        max_context=max_context)
