"""What the DeepSeek-V3 and GLM-4.5 families build alike: a layer of attention and a dense MLP
or sigmoid_moe.py's experts, and the trunk around the layers (embedding, final norm, lm_head,
and the checkpoint's first MTP layer as an MTPHead, nextn_head.py).

Invariant: the families differ only in their attention (latent or grouped-query) and config
mapping; the layers, norms and heads are read under the same Hugging Face names and run through
the same row invariant parts (layer.py, moe.py), so both keep the decoder's invariants. Both
attentions take a token tree's paths (a row attends to its own path's keys) and their caches
move a kept path's rows, so the trunk declares that trees verify in one pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exactdraft.models.decoder import HeadShape, Trunk
from exactdraft.models.gguf_names import GGUF_MLP, Part
from exactdraft.models.layer import Layer
from exactdraft.models.mixers import dense_mlp, norm_vector
from exactdraft.models.nextn_head import nextn_head
from exactdraft.models.sigmoid_moe import SigmoidRouting, load_sigmoid_moe
from exactdraft.models.tensors import TensorReader


def routed_layer(be: Any, reader: TensorReader, prefix: str, index: int, attention: Any, *,
                 hidden: int, dense_size: int, routing: SigmoidRouting) -> Layer:
    """Layer `index` stored under `prefix`: input_layernorm, `attention`,
    post_attention_layernorm, then a dense MLP of `dense_size` below first_k_dense_replace or
    the experts."""
    if index < routing.first_dense:
        mlp: Any = dense_mlp(be, reader, prefix + "mlp.", hidden, dense_size)
    else:
        mlp = load_sigmoid_moe(be, reader, prefix + "mlp.", hidden, routing)
    return Layer(norm_vector(be, reader, prefix + "input_layernorm.weight", hidden), attention,
                 norm_vector(be, reader, prefix + "post_attention_layernorm.weight", hidden),
                 mlp)


def routed_trunk(be: Any, reader: TensorReader, c: Any, layer: Callable[[str, int, int], Layer],
                 *, model_type: str, num_kv_heads: int, head_dim: int, max_context: int | None,
                 latent: bool = False, head_shape: HeadShape | None = None) -> Trunk:
    """The trunk of `c.num_layers` layers `layer(prefix, index, kv_slot)` (c: a family config
    with the sizes, eps, eos ids, tie_word_embeddings and mtp_layers), with the MTPHead of layer
    `c.num_layers` where the config counts MTP layers and the checkpoint stores one."""
    hidden = c.hidden_size
    layers = [layer(f"model.layers.{i}.", i, i) for i in range(c.num_layers)]
    embedding = reader.array("model.embed_tokens.weight", (c.vocab_size, hidden))
    head = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    output = reader.get(head, (c.vocab_size, hidden))
    lm_head = be.matrix(output)
    mtp, prefix = None, f"model.layers.{c.num_layers}."
    if c.mtp_layers and reader.has(prefix + "eh_proj.weight"):
        limit = min(max_context or c.max_position_embeddings, c.max_position_embeddings)
        mtp = nextn_head(be, reader, prefix, layer(prefix, c.num_layers, 0), embedding, lm_head,
                         hidden=hidden, vocab_size=c.vocab_size, eps=c.rms_norm_eps,
                         num_kv_heads=num_kv_heads, head_dim=head_dim, max_context=limit,
                         latent=latent)
    return Trunk(
        model_type=model_type, source=c.source, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, eos_token_ids=c.eos_token_ids,
        eps=c.rms_norm_eps, hidden_size=hidden, embedding=embedding,
        final_norm=norm_vector(be, reader, "model.norm.weight", hidden), lm_head=lm_head,
        layers=layers, kv_layers=c.num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim,
        digest=reader.digest, output_table=lambda: output, config=c, mtp=mtp,
        head_shape=head_shape, verifies_trees=True)


# llama.cpp's names of the feed-forward and MTP parts both families store alike (the part after
# `blk.N.` -> the name under `model.layers.N.`).
ROUTED_GGUF_PARTS = {
    **GGUF_MLP,
    "exp_probs_b.bias": Part("mlp.gate.e_score_correction_bias"),
    **{f"ffn_{kind}_shexp.weight": Part(f"mlp.shared_experts.{kind}_proj.weight")
       for kind in ("gate", "up", "down")},
    **{f"nextn.{gguf}.weight": Part(f"{hf}.weight") for gguf, hf in (
        ("eh_proj", "eh_proj"), ("enorm", "enorm"), ("hnorm", "hnorm"),
        ("shared_head_norm", "shared_head.norm"), ("shared_head_head", "shared_head.head"),
        ("embed_tokens", "embed_tokens"))},  # the MTP layer's own copy, not read
}
GGUF_GLOBALS = {"token_embd.weight": "model.embed_tokens.weight",
                "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
