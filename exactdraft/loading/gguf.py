"""Reading GGUF checkpoints (llama, qwen2, qwen3) as one ModelConfig and canonical tensors.

Invariant: every tensor handed out holds exactly the values the file stores, under its Hugging
Face name and in Hugging Face's layout. F16 and BF16 widen exactly; Q8_0, Q4_0 and Q4_1 blocks
dequantize exactly to float32 (or stay as their raw blocks); the q/k rows that llama.cpp's
converter interleaved for its rope are put back in rotate-half order. The whole file is checked
(architecture, every tensor's name and type) before any tensor is converted, so a bad file fails
at load with the file and the tensor named.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from exactdraft.loading.safetensors_file import CheckpointError, bf16_to_float32
from exactdraft.loading.tokenizer import Tokenizer, TokenizerError
from exactdraft.models.config import ConfigError, ModelConfig, RopeScaling
from exactdraft.models.weights import QuantizedTensor, WeightError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
DENSE_TYPES = ("F32", "F16", "BF16")
BLOCK_TYPES = ("Q8_0", "Q4_0", "Q4_1")

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(weight|bias)")
# llama.cpp runs the llama architecture with an interleaved rope and permutes these rows for it.
_ROTATED_TENSOR = re.compile(r"blk\.\d+\.attn_(q|k)\.(weight|bias)")
# Llama-3 style per-frequency rope factors: read into the config, not handed out as a weight.
_ROPE_FACTORS = "rope_freqs.weight"


class GGUFError(CheckpointError):
    """A GGUF file cannot be read; the message names the file and the problem."""


@dataclass
class GGUFCheckpoint:
    config: ModelConfig
    tensors: Mapping[str, np.ndarray | QuantizedTensor]
    # None when the file carries no tokenizer metadata.
    tokenizer: Tokenizer | None
    metadata: dict[str, Any] = field(default_factory=dict)


def load_gguf(path: str | os.PathLike[str], *, keep_quantized: bool = False,
              with_tokenizer: bool = True) -> GGUFCheckpoint:
    """Read a GGUF checkpoint. Block-quantized matrices are dequantized to float32 unless
    `keep_quantized`, which keeps them as QuantizedTensor (vectors are always float32).
    `with_tokenizer=False` skips the tokenizer, e.g. for a vocabulary type we cannot build."""
    path = os.fspath(path)
    reader = _open_reader(path)
    fields = _read_fields(reader, path)
    architecture = fields.get("general.architecture")
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"{path}: unsupported GGUF architecture {architecture!r}; supported: "
                          + ", ".join(SUPPORTED_ARCHITECTURES))
    entries = _check_tensors(path, reader)
    config = config_from_gguf(fields, entries, path)
    tokenizer = None
    if with_tokenizer and "tokenizer.ggml.model" in fields:
        try:
            tokenizer = Tokenizer.from_gguf(fields)
        except TokenizerError as error:
            raise TokenizerError(f"{path}: {error}; load_gguf(..., with_tokenizer=False) loads "
                                 "the weights alone") from None
    tensors: dict[str, np.ndarray | QuantizedTensor] = {}
    for gguf_name, entry in entries.items():
        name = canonical_name(gguf_name)
        if name is None:
            continue
        order = None
        rotated = _ROTATED_TENSOR.fullmatch(gguf_name)
        if architecture == "llama" and rotated is not None:
            heads = config.num_heads if rotated.group(1) == "q" else config.num_kv_heads
            order = rope_row_order(heads, config.head_dim)
        tensors[name] = _convert(entry, order, keep_quantized)
    metadata = {
        "path": path,
        "architecture": architecture,
        "name": fields.get("general.name"),
        "file_type": _file_type_name(fields.get("general.file_type")),
        "quantization_version": fields.get("general.quantization_version"),
        "tensor_types": dict(Counter(e.tensor_type.name for e in entries.values())),
        "tokenizer_model": fields.get("tokenizer.ggml.model"),
        "tokenizer_pre": fields.get("tokenizer.ggml.pre"),
    }
    return GGUFCheckpoint(config=config, tensors=tensors, tokenizer=tokenizer, metadata=metadata)


def read_gguf_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """All key/value metadata of a GGUF file (tokenizer arrays included) as Python values."""
    path = os.fspath(path)
    return _read_fields(_open_reader(path), path)


def canonical_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor; None for the rope factors; error if unknown."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name == _ROPE_FACTORS:
        return None
    match = _LAYER_TENSOR.fullmatch(gguf_name)
    if match is None or match.group(2) not in _LAYER_NAMES:
        raise WeightError(f"unexpected GGUF tensor {gguf_name!r}: not part of a supported "
                          "llama-family decoder")
    index, part, kind = match.groups()
    return f"model.layers.{index}.{_LAYER_NAMES[part]}.{kind}"


def rope_row_order(num_heads: int, head_dim: int) -> np.ndarray:
    """Row indices that undo llama.cpp's q/k permutation: hf_rows = gguf_rows[order].

    The converter moves, within each head, row j * head_dim / 2 + i (half j, pair index i) to
    row 2 * i + j, so that rotated pairs sit next to each other for the interleaved rope."""
    half = head_dim // 2
    within = np.arange(head_dim)
    per_head = (within % half) * 2 + within // half
    return (np.arange(num_heads)[:, None] * head_dim + per_head[None, :]).reshape(-1)


def config_from_gguf(fields: Mapping[str, Any], entries: Mapping[str, Any],
                     path: str = "<gguf>") -> ModelConfig:
    """Map GGUF metadata (and which tensors exist) onto a ModelConfig."""
    arch = fields["general.architecture"]

    def key(name: str, default: Any = None, kind: type = int) -> Any:
        value = fields.get(f"{arch}.{name}", default)
        if value is None:
            raise ConfigError(f"{path}: GGUF metadata has no {arch}.{name}")
        if isinstance(value, list):
            raise ConfigError(f"{path}: per-layer {arch}.{name} is not supported, got {value}")
        return kind(value)

    hidden = key("embedding_length")
    heads = key("attention.head_count")
    head_dim = key("attention.key_length", hidden // heads)
    value_dim = key("attention.value_length", head_dim)
    if value_dim != head_dim:
        raise ConfigError(f"{path}: value head size {value_dim} differs from key head size "
                          f"{head_dim}; not supported")
    rope_dim = key("rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise ConfigError(f"{path}: partial rotary embeddings ({rope_dim} of {head_dim} "
                          "dimensions) are not supported")
    theta = key("rope.freq_base", 10000.0, float)
    layers = key("block_count")
    embedding = entries["token_embd.weight"].shape
    tokens = fields.get("tokenizer.ggml.tokens")
    vocab = key("vocab_size", len(tokens) if tokens else int(embedding[1]))
    if vocab != int(embedding[1]):
        raise ConfigError(f"{path}: vocabulary of {vocab} tokens but token_embd.weight has "
                          f"{int(embedding[1])} rows")
    scaling = _rope_scaling(fields, arch, path)
    if _ROPE_FACTORS in entries:
        if scaling is not None:
            raise ConfigError(f"{path}: both rope scaling metadata and {_ROPE_FACTORS}")
        original = key("rope.scaling.original_context_length", 8192)
        factors = np.asarray(entries[_ROPE_FACTORS].data, dtype=np.float64).reshape(-1)
        scaling = llama3_scaling_from_factors(factors, head_dim, theta, original, path)
    window = key("attention.sliding_window", 0)
    eos = fields.get("tokenizer.ggml.eos_token_id")
    extra = [fields.get(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
    eos_ids = tuple(dict.fromkeys(int(i) for i in [eos, *extra] if i is not None))
    bos = fields.get("tokenizer.ggml.bos_token_id")
    return ModelConfig(
        model_type=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=key("feed_forward_length"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=key("attention.head_count_kv", heads),
        head_dim=head_dim,
        rms_norm_eps=key("attention.layer_norm_rms_epsilon", 1e-6, float),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=key("context_length", 2048),
        tie_word_embeddings="output.weight" not in entries,
        attention_bias="blk.0.attn_q.bias" in entries,
        attention_output_bias="blk.0.attn_output.bias" in entries,
        mlp_bias="blk.0.ffn_up.bias" in entries,
        qk_norm="blk.0.attn_q_norm.weight" in entries,
        sliding_windows=(window,) * layers,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=eos_ids,
    )


def llama3_scaling_from_factors(factors: np.ndarray, head_dim: int, theta: float,
                                original_context: int, path: str = "<gguf>") -> RopeScaling | None:
    """Recover llama3 rope scaling from llama.cpp's per-frequency factors (rope_freqs.weight).

    Factors are 1 for high frequencies, `factor` for low ones and smoothly in between; only
    low_freq_factor / original and high_freq_factor / original are identifiable, so the original
    context is taken as given and the two factors are fitted, then checked against every factor."""
    from exactdraft.models.transformer import rope_frequencies

    if factors.shape != (head_dim // 2,):
        raise ConfigError(f"{path}: {_ROPE_FACTORS} has {factors.size} entries, expected "
                          f"{head_dim // 2}")
    if np.all(factors == 1.0):
        return None
    factor = float(factors.max())
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ratio = original_context * inv_freq / (2 * math.pi)
    medium = (factors > 1.0) & (factors < factor)
    low, high = 1.0, 4.0
    if medium.sum() >= 2 and factor > 1.0:
        smooth = (1.0 / factors[medium] - 1.0 / factor) / (1.0 - 1.0 / factor)
        slope, intercept = np.polyfit(ratio[medium], smooth, 1)
        low = round(float(-intercept / slope), 3)
        high = round(low + float(1.0 / slope), 3)
    scaling = RopeScaling("llama3", factor=round(factor, 4), low_freq_factor=low,
                          high_freq_factor=high, original_max_position_embeddings=original_context)
    probe = SimpleNamespace(head_dim=head_dim, rope_theta=theta, rope_scaling=scaling)
    if not np.allclose(inv_freq / rope_frequencies(probe), factors, rtol=1e-4, atol=0):
        raise ConfigError(f"{path}: {_ROPE_FACTORS} does not follow llama3 rope scaling; "
                          "these per-frequency factors are not supported")
    return scaling


def _rope_scaling(fields: Mapping[str, Any], arch: str, path: str) -> RopeScaling | None:
    kind = fields.get(f"{arch}.rope.scaling.type")
    factor = fields.get(f"{arch}.rope.scaling.factor", fields.get(f"{arch}.rope.scale_linear"))
    if kind is None and factor is not None:
        kind = "linear"
    if kind in (None, "none") or (kind == "linear" and float(factor or 1.0) == 1.0):
        return None
    if kind != "linear":
        raise ConfigError(f"{path}: unsupported rope scaling type {kind!r}; supported: linear "
                          f"(and llama3 factors in {_ROPE_FACTORS})")
    return RopeScaling("linear", factor=float(factor))


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ImportError("reading GGUF files needs the gguf package: "
                          "pip install 'exactdraft[gguf]'") from None
    return gguf


def _open_reader(path: str) -> Any:
    gguf = _import_gguf()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF file at {path}")
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as error:
        # The reader indexes the memory map directly, so a short or damaged file surfaces as
        # whatever numpy or struct error comes first; name the file instead.
        raise GGUFError(f"{path}: truncated or corrupt GGUF file ({type(error).__name__}: "
                        f"{error})") from None
    if reader.byte_order != "I":
        raise GGUFError(f"{path}: byte-swapped (big-endian) GGUF files are not supported")
    return reader


def _read_fields(reader: Any, path: str) -> dict[str, Any]:
    fields = {}
    for name, value in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            fields[name] = value.contents()
        except Exception as error:
            raise GGUFError(f"{path}: corrupt GGUF metadata {name!r} ({error})") from None
    return fields


def _check_tensors(path: str, reader: Any) -> dict[str, Any]:
    size = os.path.getsize(path)
    entries = {}
    for entry in reader.tensors:
        kind = entry.tensor_type.name
        if kind not in DENSE_TYPES + BLOCK_TYPES:
            raise WeightError(f"{path}: tensor {entry.name!r} has type {kind}, which is not "
                              "supported; supported: " + ", ".join(DENSE_TYPES + BLOCK_TYPES))
        if entry.data_offset + entry.n_bytes > size:
            raise GGUFError(f"{path}: truncated GGUF file: tensor {entry.name!r} ends at byte "
                            f"{entry.data_offset + entry.n_bytes} of {size}")
        try:
            canonical_name(entry.name)
        except WeightError as error:
            raise WeightError(f"{path}: {error}") from None
        entries[entry.name] = entry
    if "token_embd.weight" not in entries:
        raise WeightError(f"{path}: GGUF file has no token_embd.weight")
    return entries


def _convert(entry: Any, order: np.ndarray | None,
             keep_quantized: bool) -> np.ndarray | QuantizedTensor:
    kind = entry.tensor_type.name
    shape = tuple(int(d) for d in reversed(entry.shape.tolist()))
    data = np.asarray(entry.data)
    if kind in BLOCK_TYPES:
        # Permuting whole rows of blocks permutes the rows of the matrix they encode.
        rows = data.reshape(-1, data.shape[-1])
        if order is not None:
            rows = rows[order]
        quantized = QuantizedTensor(kind.lower(), rows, (rows.shape[0], shape[-1]))
        if keep_quantized and len(shape) == 2:
            return quantized
        return quantized.dequantize().reshape(shape)
    if kind == "F16":
        values = data.astype(np.float32)
    elif kind == "BF16":
        values = bf16_to_float32(data.view("<u2")).reshape(shape)
    else:
        values = data
    return values[order] if order is not None else values


def _file_type_name(value: Any) -> str | None:
    if value is None:
        return None
    try:
        return _import_gguf().LlamaFileType(int(value)).name
    except ValueError:
        return str(value)
