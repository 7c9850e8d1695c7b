"""llama.cpp's names and metadata mapped onto a family's Hugging Face names and settings: the
GGUF helpers every family shares (one module, so that no family imports another).

Invariant: every tensor of a GGUF file is accounted for: it maps to exactly one name the family
reads, or it is one the family declares it reads another way (rope factors, for instance), or
the file is refused naming the tensor; a tensor is read only when the model asks for it, and it
reaches the model with the values and [rows, K] layout the file stores, transformed only by the
family's own function (llama's q/k row order, for instance).

Two mappings: RenamedTensors for the families whose layers TensorNames describes (llama,
gemma3), GGUFRenamed for the mixture-of-experts and hybrid families, whose stacked expert tensors
[E, rows, K] become one matrix per expert, sliced from the file's blocks without decoding the
other experts.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from exactdraft.errors import ConfigError, WeightError
from exactdraft.formats.table import QuantizedTensor
from exactdraft.models.config import ConfigReader, RopeScaling
from exactdraft.models.tensors import tensor_shape
from exactdraft.models.transformer import TensorNames

ROPE_FACTORS = "rope_freqs.weight"  # llama3 rope scaling as per-frequency factors

_GLOBAL = {"token_embd.weight": "embedding", "output_norm.weight": "final_norm",
           "output.weight": "lm_head"}
# GGUF part -> TensorNames field; projections carry .weight/.bias, norms only .weight.
_LAYER = {
    "attn_norm": "attention_norm", "attn_q": "q", "attn_k": "k", "attn_v": "v",
    "attn_output": "output", "attn_q_norm": "q_norm", "attn_k_norm": "k_norm",
    "post_attention_norm": "post_attention_norm", "ffn_norm": "mlp_norm", "ffn_gate": "gate",
    "ffn_up": "up", "ffn_down": "down", "post_ffw_norm": "post_mlp_norm",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")

# (GGUF name, the value read from the file) -> the value the model gets.
Transform = Callable[[str, Any], Any]


def hf_name(names: TensorNames, gguf_name: str) -> str | None:
    """The family's name for a GGUF tensor, or None when the family has no such tensor."""
    if gguf_name in _GLOBAL:
        return getattr(names, _GLOBAL[gguf_name])
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER:
        return None
    index, part, kind = match.groups()
    template = getattr(names, _LAYER[part])
    if template is None:
        return None
    if template.endswith(".weight"):
        return template.format(i=index) if kind == "weight" else None
    return template.format(i=index) + "." + kind


class RenamedTensors(Mapping):
    """A GGUF tensor mapping seen under the family's names (see the module invariant)."""

    def __init__(self, source: Mapping[str, Any], names: TensorNames, path: str,
                 transform: Transform | None = None, ignored: tuple[str, ...] = ()) -> None:
        self.source, self.transform = source, transform
        self.gguf_names: dict[str, str] = {}
        for gguf_name in source:
            if gguf_name in ignored:
                continue
            name = hf_name(names, gguf_name)
            if name is None:
                raise WeightError(f"{path}: unexpected GGUF tensor {gguf_name!r}: not part of "
                                  "a model of this family")
            self.gguf_names[name] = gguf_name

    def __getitem__(self, name: str) -> Any:
        gguf_name = self.gguf_names[name]
        value = self.source[gguf_name]
        return value if self.transform is None else self.transform(gguf_name, value)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.source.shape(self.gguf_names[name]))

    def __iter__(self) -> Iterator[str]:
        return iter(self.gguf_names)

    def __len__(self) -> int:
        return len(self.gguf_names)


# -- metadata ----------------------------------------------------------------------------------

def gguf_reader(fields: Mapping[str, Any], tensors: Mapping[str, Any], source: str,
                arch: str) -> ConfigReader:
    """A reader of `{arch}.*` metadata, once the file is known to have token embeddings and
    scalar (not per-layer) sizes."""
    reader = ConfigReader(fields, source, prefix=f"{arch}.")
    for key in ("embedding_length", "attention.head_count", "block_count"):
        if isinstance(reader.value(key), list):
            raise reader.fail(key, "is per layer, which is not supported")
    if "token_embd.weight" not in tensors:
        raise ConfigError(f"{source}: GGUF file has no token_embd.weight")
    return reader


def gguf_head_dim(reader: ConfigReader, hidden: int, heads: int) -> int:
    head_dim = reader.int("attention.key_length", hidden // heads)
    if reader.int("attention.value_length", head_dim) != head_dim:
        raise reader.fail("attention.value_length", f"differs from the key head size "
                          f"{head_dim}; not supported")
    return head_dim


def gguf_special_tokens(fields: Mapping[str, Any], source: str) -> dict[str, Any]:
    """bos_token_id and eos_token_ids (eos, end of turn, end of message) of GGUF metadata."""
    reader = ConfigReader(fields, source, prefix="tokenizer.ggml.")
    eos = [reader.int(f"{k}_token_id", None, minimum=0) for k in ("eos", "eot", "eom")]
    return {"bos_token_id": reader.int("bos_token_id", None, minimum=0),
            "eos_token_ids": tuple(dict.fromkeys(i for i in eos if i is not None))}


def gguf_rope_scaling(reader: ConfigReader) -> RopeScaling | None:
    kind = reader.value("rope.scaling.type", None)
    factor = reader.value("rope.scaling.factor", reader.value("rope.scale_linear", None))
    if kind is None and factor is not None:
        kind = "linear"
    if kind in (None, "none"):
        return None
    if kind != "linear":
        raise reader.fail("rope.scaling.type", f"{kind!r} is not supported; supported: "
                          f"linear (and llama3 factors in {ROPE_FACTORS})")
    factor = reader.float("rope.scaling.factor", reader.float("rope.scale_linear", 1.0))
    return None if factor == 1.0 else RopeScaling("linear", factor=factor)


# -- values --------------------------------------------------------------------------------------

def rope_row_order(num_heads: int, head_dim: int) -> np.ndarray:
    """Row indices that undo llama.cpp's q/k permutation: hf_rows = gguf_rows[order].

    The converter moves, within each head, row j * head_dim / 2 + i (half j, pair index i) to
    row 2 * i + j, so that rotated pairs sit next to each other for the interleaved rope."""
    half = head_dim // 2
    within = np.arange(head_dim)
    per_head = (within % half) * 2 + within // half
    return (np.arange(num_heads)[:, None] * head_dim + per_head[None, :]).reshape(-1)


def take_rows(value: Any, order: np.ndarray) -> Any:
    """The rows `order` of a weight (blocks move as whole rows) or of a bias vector."""
    if isinstance(value, QuantizedTensor):
        return QuantizedTensor(value.format, np.ascontiguousarray(value.data[order]),
                               value.shape)
    return np.ascontiguousarray(np.asarray(value)[order])


# -- the mixture-of-experts and hybrid families' tensors --------------------------------------

_ANY_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(.+)")
Shape = tuple[int, ...]


class GGUFSource(Protocol):
    """What GGUFRenamed reads of a GGUF file's tensors (exactdraft.loading.gguf.GGUFTensors):
    values by GGUF name, shapes without reading, and one entry of a stacked tensor."""

    def __getitem__(self, name: str) -> Any: ...
    def __iter__(self) -> Iterator[str]: ...
    def shape(self, name: str) -> tuple[int, ...]: ...
    def is_block_quantized(self, name: str) -> bool: ...
    def stacked_entry(self, name: str, index: int) -> Any: ...


@dataclass(frozen=True)
class Part:
    """Where one kind of GGUF layer tensor (the name after `blk.N.`: `attn_q.weight`, ...)
    goes: `name` under the layer's prefix ("{e}" in it makes one matrix per expert of a
    stacked [E, rows, K] tensor), `shape` the shape the family reads where it differs from the
    file's (a function of that), and `convert` the change of values, if any, from the file's
    layout to the family's."""

    name: str
    shape: Callable[[Shape], Shape] | None = None
    convert: Callable[[Any], Any] | None = None


# llama.cpp's attention and MLP layer tensors -> names under a layer's prefix.
GGUF_ATTENTION = {
    "attn_norm.weight": Part("input_layernorm.weight"),
    **{f"attn_{gguf}.{kind}": Part(f"self_attn.{hf}_proj.{kind}")
       for gguf, hf in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o"))
       for kind in ("weight", "bias")},
    "attn_q_norm.weight": Part("self_attn.q_norm.weight"),
    "attn_k_norm.weight": Part("self_attn.k_norm.weight"),
}
GGUF_MLP = {
    "ffn_gate_inp.weight": Part("mlp.gate.weight"),
    **{f"ffn_{kind}.weight": Part(f"mlp.{kind}_proj.weight") for kind in ("gate", "up", "down")},
    **{f"ffn_{kind}_exps.weight": Part(f"mlp.experts.{{e}}.{kind}_proj.weight")
       for kind in ("gate", "up", "down")},
}


class GGUFRenamed(Mapping):
    """A GGUF file's tensors under a family's names, read on access (see the module docstring).

    `names` maps whole GGUF names (token_embd.weight, ...) to the family's; `parts` maps the
    part after `blk.N.` to a Part, placed under `prefix(N)`."""

    def __init__(self, tensors: GGUFSource, source: str, names: Mapping[str, str],
                 parts: Mapping[str, Part], prefix: Callable[[int], str]) -> None:
        self.tensors = tensors
        self.entries: dict[str, tuple[Shape, Callable[[], Any]]] = {}
        self._stacks: dict[str, np.ndarray] = {}  # the last dense stacks decoded
        for gguf_name in tensors:
            shape = tensor_shape(tensors, gguf_name)
            if gguf_name in names:
                self.entries[names[gguf_name]] = (shape, functools.partial(
                    tensors.__getitem__, gguf_name))
                continue
            match = _ANY_LAYER_TENSOR.fullmatch(gguf_name)
            part = None if match is None else parts.get(match.group(2))
            if part is None:
                raise WeightError(f"{source}: unexpected GGUF tensor {gguf_name!r}: not part of "
                                  "a model of this family")
            name = prefix(int(match.group(1))) + part.name
            if "{e}" in part.name:
                for e in range(shape[0]):
                    self.entries[name.format(e=e)] = (shape[1:], functools.partial(
                        self.expert, gguf_name, e))
            else:
                self.entries[name] = (part.shape(shape) if part.shape else shape,
                                      functools.partial(self._read, gguf_name, part))

    def _read(self, gguf_name: str, part: Part) -> Any:
        value = self.tensors[gguf_name]
        if part.shape is not None:
            shape = part.shape(tensor_shape(self.tensors, gguf_name))
            value = np.asarray(value, dtype=np.float32).reshape(shape)
        return value if part.convert is None else part.convert(value)

    def expert(self, gguf_name: str, expert: int) -> Any:
        """Expert `expert`'s [rows, K] of a stack [E, rows, K]: the source's own entry for a
        block-quantized stack (its blocks, or float32 when the source dequantizes), else
        float32 rows of the stack, decoded once for a layer's gate, up and down."""
        if self.tensors.is_block_quantized(gguf_name):
            return self.tensors.stacked_entry(gguf_name, expert)
        if gguf_name not in self._stacks:
            if len(self._stacks) == 3:
                self._stacks.pop(next(iter(self._stacks)))
            self._stacks[gguf_name] = np.asarray(self.tensors[gguf_name], dtype=np.float32)
        return self._stacks[gguf_name][expert]

    def __getitem__(self, name: str) -> Any:
        return self.entries[name][1]()

    def shape(self, name: str) -> Shape:
        return self.entries[name][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def gguf_decoder_shape(reader: ConfigReader, fields: Mapping[str, Any], tensors: Any,
                       max_position_embeddings: int) -> dict[str, Any]:
    """The DecoderConfig fields every GGUF decoder file states the same way (sizes, head counts,
    norm epsilon, context, tied embeddings when there is no output.weight, the vocabulary from
    token_embd's rows, special tokens), read from `reader` (keys under the architecture);
    `max_position_embeddings` is the family's default context."""
    source = reader.source
    hidden = reader.int("embedding_length")
    heads = reader.int("attention.head_count")
    layers = reader.int("block_count")
    head_dim = reader.int("attention.key_length", hidden // heads)
    if reader.int("attention.value_length", head_dim) != head_dim:
        raise reader.fail("attention.value_length", f"differs from the key head size "
                          f"{head_dim}; not supported")
    if "token_embd.weight" not in tensors:
        raise ConfigError(f"{source}: GGUF file has no token_embd.weight")
    return dict(
        vocab_size=int(tensors.shape("token_embd.weight")[0]), hidden_size=hidden,
        intermediate_size=reader.int("feed_forward_length"), num_layers=layers,
        num_heads=heads, num_kv_heads=reader.int("attention.head_count_kv", heads),
        head_dim=head_dim, rms_norm_eps=reader.float("attention.layer_norm_rms_epsilon", 1e-6),
        max_position_embeddings=reader.int("context_length", max_position_embeddings),
        tie_word_embeddings="output.weight" not in tensors,
        **gguf_special_tokens(fields, source), source=source)
