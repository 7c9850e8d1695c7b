"""The multi-token-prediction layers a checkpoint ships (`mtp.*` in Qwen3-Next and Qwen3.5
checkpoints, which transformers drops on load), run as a small model of their own for
MTPDrafter.

For the target's final hidden row h_t at position t (the input of its lm_head) and the token
x_{t+1} after it, one MTP step computes
    u = fc([rms_norm(embed(x_{t+1}), pre_fc_norm_embedding); rms_norm(h_t, pre_fc_norm_hidden)])
    u = the MTP decoder layer (attention over the head's own KV cache at position t, then the
        MLP or MoE; the layer of the checkpoint's trunk, always full attention)
    g = rms_norm(u, norm); logits = lm_head(g)  (the target's embedding and lm_head)
and the logits guess x_{t+2}. A further step feeds g back as the hidden row with the guessed
token, at position t + 1 (the layer used at step j is j mod the number of MTP layers).

Invariant: the head only proposes drafts. Its arithmetic is the trunk's (the same backend ops
and mixers), but nothing it computes reaches a committed token: the verifier keeps a draft only
if it equals the target's own sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend
from exactdraft.models.cache import KVCache
from exactdraft.models.layer import Layer
from exactdraft.models.mixers import PassContext, SequencePass
from exactdraft.models.rows import checked_tokens, embedding_rows
from exactdraft.models.state import SequenceState


@dataclass
class MTPHead:
    backend: Backend
    fc: Any  # matrix [H, 2H]
    embedding_norm: Any
    hidden_norm: Any
    final_norm: Any
    layers: list[Layer]  # attention and an MLP or mixture of experts each
    embedding: Any  # the target's host table [V, H]
    lm_head: Any  # the target's matrix [V, H]
    eps: float
    vocab_size: int
    num_kv_heads: int
    head_dim: int
    max_context: int

    def new_state(self) -> SequenceState:
        cache = KVCache(self.backend, len(self.layers), self.num_kv_heads, self.head_dim,
                        self.max_context)
        return SequenceState(cache, [], 1)

    def truncate(self, state: SequenceState, length: int) -> None:
        state.restore(min(length, state.length))

    def forward(self, state: SequenceState, tokens: Sequence[int], hidden: np.ndarray,
                step: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Rows for positions state.length..: tokens[i] is the token after the position whose
        hidden row is hidden[i]. Returns the logits [R, V] and the head's own final hidden rows
        [R, H] (the hidden input of a further step)."""
        be = self.backend
        start = state.length
        ids = checked_tokens(tokens, start, self.vocab_size, self.max_context)
        state.cache.reserve_for(ids.size)
        embedded = be.rms_norm(be.vector(embedding_rows(self.embedding, ids)),
                               self.embedding_norm, self.eps)
        carried = be.rms_norm(be.vector(np.asarray(hidden, dtype=np.float32)),
                              self.hidden_norm, self.eps)
        joined = np.concatenate([be.to_host(embedded), be.to_host(carried)], axis=1)
        x = be.linear(be.vector(joined), self.fc)
        part = SequencePass(state, start, ids.size, keep_from=ids.size)
        x = self.layers[step % len(self.layers)].run(be, x, PassContext(be, [part]), self.eps)
        state.commit(start, ids.tolist(), ids.size, [])
        normed = be.rms_norm(x, self.final_norm, self.eps)
        return be.to_host(be.linear(normed, self.lm_head)), np.array(be.to_host(normed))
