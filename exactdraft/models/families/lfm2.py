"""The LFM2 family (LiquidAI LFM2 and LFM2.5, transformers' `lfm2`): config mapping, tensor names
and the model (a DecoderModel of gated short convolutions beside attention layers).

Invariant: a checkpoint reaches DecoderModel with the values it stores and the family's choices
made explicit: each layer is h = h + mixer(rms_norm(h, operator_norm)), then
h = h + mlp(rms_norm(h, ffn_norm)), the mixer named by `layer_types` ("conv" or
"full_attention"; or `full_attn_idxs`, every layer attention when neither is given): the gated
short convolution (short_conv.py, kernel `conv_L_cache`, biases where `conv_bias`) or attention
with per-head q/k RMS norms and a full rope; the MLP is silu-gated (w1 gate, w3 up, w2 down) of
the size transformers derives from `block_ff_dim` / `intermediate_size` (two thirds of it,
times `block_ffn_dim_multiplier` and rounded up to `block_multiple_of` when
`block_auto_adjust_ff_dim`); the final norm is the one Hugging Face calls `embedding_norm`;
embeddings are tied unless the config says otherwise. Norm weights are used as stored.

Internally the attention's tensors carry the names load_attention reads (o_proj, q_norm,
k_norm for LFM2's out_proj, q_layernorm, k_layernorm), so the hybrid tensor-parallel split
finds them as stored. GGUF files: llama.cpp's `lfm2` architecture; a layer is a convolution
where `attention.head_count_kv` is 0 for it; the final norm is stored as `token_embd_norm`, the
convolution's kernel squeezed to [H, K]; q/k rows are stored as Hugging Face has them (its rope
is NEOX-style, so the converter leaves them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.models.blocks import RopeTable, rope_frequencies
from exactdraft.models.config import (
    ConfigReader,
    RopeScaling,
    rope_scaling_from_hf,
    rope_theta_from_hf,
)
from exactdraft.models.decoder import DecoderModel, HeadShape, Trunk
from exactdraft.models.families.registry import Family
from exactdraft.models.gguf_names import (
    GGUFRenamed,
    Part,
    gguf_head_dim,
    gguf_reader,
    gguf_rope_scaling,
    gguf_special_tokens,
)
from exactdraft.models.layer import Layer
from exactdraft.models.mixers import dense_mlp, load_attention, norm_vector
from exactdraft.models.short_conv import ShortConv
from exactdraft.models.split import TensorParallelSplit
from exactdraft.models.tensors import TensorReader, tensor_shape

MLP_NAMES = ("w1", "w3", "w2")  # gate, up, down
# LFM2's attention names -> the names load_attention reads.
ATTENTION_NAMES = {"self_attn.out_proj.": "self_attn.o_proj.",
                   "self_attn.q_layernorm.": "self_attn.q_norm.",
                   "self_attn.k_layernorm.": "self_attn.k_norm."}


@dataclass(frozen=True)
class Lfm2Config:
    source: str
    vocab_size: int
    hidden_size: int
    attention_layers: tuple[bool, ...]  # per layer: attention (True) or short convolution
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rope_scaling: RopeScaling | None
    eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    intermediate_size: int
    conv_kernel: int
    conv_bias: bool
    model_type: str = "lfm2"

    @property
    def num_layers(self) -> int:
        return len(self.attention_layers)


def feed_forward_size(reader: ConfigReader) -> int:
    """The MLP's inner size as transformers' Lfm2MLP derives it from the config."""
    size = reader.int("block_ff_dim", reader.int("intermediate_size", 12288))
    if not reader.bool("block_auto_adjust_ff_dim", True):
        return size
    size = int(2 * size / 3)
    # An explicit null multiplier (transformers' None) skips the multiplier and the rounding.
    if "block_ffn_dim_multiplier" in reader.raw and not reader.has("block_ffn_dim_multiplier"):
        return size
    multiple = reader.int("block_multiple_of", 256)
    size = int(reader.float("block_ffn_dim_multiplier", 1.0) * size)
    return multiple * ((size + multiple - 1) // multiple)


def config_from_hf(raw: Mapping[str, Any], source: str) -> Lfm2Config:
    reader = ConfigReader(raw, source)
    layers = reader.int("num_hidden_layers")
    kinds = reader.value("layer_types", None)
    if kinds is None:
        indices = reader.value("full_attn_idxs", None)
        if indices is None:
            indices = list(range(layers))
        if not isinstance(indices, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in indices):
            raise reader.fail("full_attn_idxs", f"must list layer indices, got {indices!r}")
        kinds = ["full_attention" if i in indices else "conv" for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or \
            not set(kinds) <= {"conv", "full_attention"}:
        raise reader.fail("layer_types", f"must list conv or full_attention for each of the "
                          f"{layers} layers, got {kinds!r}")
    hidden = reader.int("hidden_size")
    heads = reader.int("num_attention_heads")
    tied = reader.bool("tie_word_embeddings", True)
    return Lfm2Config(
        source=source, vocab_size=reader.int("vocab_size"), hidden_size=hidden,
        attention_layers=tuple(kind == "full_attention" for kind in kinds), num_heads=heads,
        num_kv_heads=reader.int("num_key_value_heads", heads),
        head_dim=reader.int("head_dim", hidden // heads),
        rope_theta=rope_theta_from_hf(reader, 1000000.0),
        rope_scaling=rope_scaling_from_hf(reader), eps=reader.float("norm_eps", 1e-5),
        max_position_embeddings=reader.int("max_position_embeddings", 128000),
        tie_word_embeddings=reader.bool("tie_embedding", tied),
        eos_token_ids=reader.token_ids("eos_token_id"),
        intermediate_size=feed_forward_size(reader),
        conv_kernel=reader.int("conv_L_cache", 3), conv_bias=reader.bool("conv_bias", False))


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any],
                     source: str) -> Lfm2Config:
    arch = fields["general.architecture"]
    reader = gguf_reader(fields, tensors, source, arch)
    hidden = reader.int("embedding_length")
    heads = reader.int("attention.head_count")
    layers = reader.int("block_count")
    kv_heads = reader.value("attention.head_count_kv", heads)
    if not isinstance(kv_heads, list):
        kv_heads = [kv_heads] * layers
    attention_counts = sorted({n for n in kv_heads if n})
    if len(kv_heads) != layers or len(attention_counts) > 1 or not all(
            isinstance(n, int) and n >= 0 for n in kv_heads):
        raise reader.fail("attention.head_count_kv", f"must give, for each of the {layers} "
                          f"layers, 0 (a convolution) or the one head count of the attention "
                          f"layers, got {kv_heads!r}")
    return Lfm2Config(
        source=source, vocab_size=int(tensors.shape("token_embd.weight")[0]),
        hidden_size=hidden, attention_layers=tuple(n > 0 for n in kv_heads), num_heads=heads,
        num_kv_heads=attention_counts[0] if attention_counts else heads,
        head_dim=gguf_head_dim(reader, hidden, heads),
        rope_theta=reader.float("rope.freq_base", 1000000.0),
        rope_scaling=gguf_rope_scaling(reader),
        eps=reader.float("attention.layer_norm_rms_epsilon", 1e-5),
        max_position_embeddings=reader.int("context_length", 128000),
        tie_word_embeddings="output.weight" not in tensors,
        eos_token_ids=gguf_special_tokens(fields, source)["eos_token_ids"],
        intermediate_size=reader.int("feed_forward_length"),
        conv_kernel=reader.int("shortconv.l_cache"),
        conv_bias=any(name.endswith("shortconv.conv.bias") for name in tensors))


class AttentionRenamed(Mapping):
    """A Hugging Face LFM2 checkpoint's tensors with the attention's under the names
    load_attention reads (ATTENTION_NAMES); every other name as stored."""

    def __init__(self, tensors: Mapping[str, Any]) -> None:
        self.tensors = tensors
        self.stored: dict[str, str] = {}
        for name in tensors:
            renamed = name
            for old, new in ATTENTION_NAMES.items():
                renamed = renamed.replace(old, new)
            self.stored[renamed] = name

    def __getitem__(self, name: str) -> Any:
        return self.tensors[self.stored[name]]

    def shape(self, name: str) -> tuple[int, ...]:
        return tensor_shape(self.tensors, self.stored[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self.stored)

    def __len__(self) -> int:
        return len(self.stored)


def gguf_tensors(config: Lfm2Config, tensors: Mapping[str, Any], source: str) -> GGUFRenamed:
    parts = {
        "attn_norm.weight": Part("operator_norm.weight"),
        "ffn_norm.weight": Part("ffn_norm.weight"),
        **{f"attn_{gguf}.weight": Part(f"self_attn.{hf}.weight")
           for gguf, hf in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"),
                            ("output", "o_proj"), ("q_norm", "q_norm"), ("k_norm", "k_norm"))},
        "shortconv.conv.weight": Part("conv.conv.weight", shape=lambda s: (s[0], 1, s[1])),
        "shortconv.conv.bias": Part("conv.conv.bias"),
        **{f"shortconv.{name}.{kind}": Part(f"conv.{name}.{kind}")
           for name in ("in_proj", "out_proj") for kind in ("weight", "bias")},
        **{f"ffn_{gguf}.weight": Part(f"feed_forward.{hf}.weight")
           for gguf, hf in (("gate", "w1"), ("up", "w3"), ("down", "w2"))},
    }
    names = {"token_embd.weight": "model.embed_tokens.weight",
             "token_embd_norm.weight": "model.embedding_norm.weight",
             "output.weight": "lm_head.weight"}
    return GGUFRenamed(tensors, source, names, parts, lambda i: f"model.layers.{i}.")


def short_conv(be: Any, reader: TensorReader, prefix: str, c: Lfm2Config,
               slot: int) -> ShortConv:
    hidden = c.hidden_size
    conv = reader.array(prefix + "conv.weight", (hidden, 1, c.conv_kernel))

    def bias(name: str, size: int) -> Any:
        return be.vector(reader.array(prefix + name, (size,))) if c.conv_bias else None

    return ShortConv(
        in_proj=be.matrix(reader.get(prefix + "in_proj.weight", (3 * hidden, hidden))),
        out_proj=be.matrix(reader.get(prefix + "out_proj.weight", (hidden, hidden))),
        conv_weight=np.ascontiguousarray(conv[:, 0, :].T),
        conv_bias=reader.array(prefix + "conv.bias", (hidden,)) if c.conv_bias else None,
        hidden_size=hidden, slot=slot, in_bias=bias("in_proj.bias", 3 * hidden),
        out_bias=bias("out_proj.bias", hidden))


def build(config: Lfm2Config, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> DecoderModel:
    c, be = config, backend
    reader = TensorReader(tensors, c.source)
    hidden = c.hidden_size
    rope = RopeTable(rope_frequencies(c.head_dim, c.rope_theta, c.rope_scaling))
    layers: list[Layer] = []
    kv_slot = slot = 0
    for i, attention in enumerate(c.attention_layers):
        prefix = f"model.layers.{i}."
        if attention:
            mixer: Any = load_attention(be, reader, prefix + "self_attn.", hidden=hidden,
                                        heads=c.num_heads, kv_heads=c.num_kv_heads,
                                        head_dim=c.head_dim, kv_slot=kv_slot, eps=c.eps,
                                        rope=rope, qk_norm=True)
            kv_slot += 1
        else:
            mixer = short_conv(be, reader, prefix + "conv.", c, slot)
            slot += 1
        layers.append(Layer(
            norm_vector(be, reader, prefix + "operator_norm.weight", hidden), mixer,
            norm_vector(be, reader, prefix + "ffn_norm.weight", hidden),
            dense_mlp(be, reader, prefix + "feed_forward.", hidden, c.intermediate_size,
                      MLP_NAMES)))
    embedding = reader.array("model.embed_tokens.weight", (c.vocab_size, hidden))
    head = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    output = reader.get(head, (c.vocab_size, hidden))
    trunk = Trunk(
        model_type="lfm2", source=c.source, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, eos_token_ids=c.eos_token_ids,
        eps=c.eps, hidden_size=hidden, embedding=embedding,
        final_norm=norm_vector(be, reader, "model.embedding_norm.weight", hidden),
        lm_head=be.matrix(output), layers=layers, kv_layers=kv_slot,
        num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, digest=reader.digest,
        output_table=lambda: output, config=c,
        head_shape=HeadShape(str(c.source), hidden, c.num_heads, c.num_kv_heads, c.head_dim,
                             c.intermediate_size, c.eps, c.rope_theta))
    return DecoderModel(trunk, be, max_context)


# Attention splits by heads where the ranks divide the KV heads; the convolutions are not
# split by channel: their projections split by output columns and every rank runs the whole
# (elementwise) convolution from the gathered rows, with TP=1's bits.
TENSOR_PARALLEL = TensorParallelSplit(
    attention=lambda reader, index: f"model.layers.{index}.self_attn.")


FAMILY = Family(
    name="lfm2",
    model_types=("lfm2",),
    gguf_architectures=("lfm2",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: AttentionRenamed(tensors),
    gguf_tensors=gguf_tensors,
    build=build,
    tensor_parallel=lambda config: TENSOR_PARALLEL,
)
