"""The llama family: llama, mistral, qwen2 and qwen3 (and llama-architecture GGUF files such as
SmolLM2): config mapping, tensor names and the model.

Invariant: whatever file it comes from, a llama-family checkpoint reaches DecoderModel (as
transformer layers) with the values it stores under Hugging Face's names and layout: GGUF q/k
rows, which llama.cpp's converter interleaves for its rope, are put back in rotate-half order,
and llama3 rope scaling stored as per-frequency factors is recovered exactly or refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from exactdraft.errors import ConfigError
from exactdraft.models.blocks import rope_frequencies
from exactdraft.models.config import (
    ConfigReader,
    DecoderConfig,
    RopeScaling,
    hf_decoder_shape,
    rope_scaling_from_hf,
    rope_theta_from_hf,
    sliding_windows_from_hf,
)
from exactdraft.models.decoder import DecoderModel
from exactdraft.models.families.registry import Family, family_for_model_type
from exactdraft.models.gguf_names import (
    ROPE_FACTORS,
    RenamedTensors,
    gguf_decoder_shape,
    gguf_rope_scaling,
    rope_row_order,
    take_rows,
)
from exactdraft.models.split import TensorParallelSplit
from exactdraft.models.transformer import TensorNames, transformer_model

NAMES = TensorNames()
# llama.cpp runs the llama architecture with an interleaved rope and permutes these rows for it.
_ROTATED_TENSOR = re.compile(r"blk\.\d+\.attn_(q|k)\.(weight|bias)")


def config_from_hf(raw: Mapping[str, Any], source: str) -> DecoderConfig:
    """Map a Hugging Face config.json (transformers 4.x or 5.x layout) onto a DecoderConfig."""
    reader = ConfigReader(raw, source)
    model_type = reader.value("model_type")
    activation = reader.value("hidden_act", "silu")
    if activation not in ("silu", "swish"):
        raise reader.fail("hidden_act", f"{activation!r} is not supported; supported: silu")
    shape = hf_decoder_shape(reader, max_position_embeddings=2048, tie_word_embeddings=False)
    attention_bias = reader.bool("attention_bias", False)
    return DecoderConfig(
        **shape,
        model_type=model_type,
        rope_theta=rope_theta_from_hf(reader),
        rope_scaling=rope_scaling_from_hf(reader),
        attention_bias=model_type == "qwen2" or attention_bias,
        attention_output_bias=model_type != "qwen2" and attention_bias,
        mlp_bias=reader.bool("mlp_bias", False),
        qk_norm=model_type == "qwen3",
        sliding_windows=sliding_windows_from_hf(reader, shape["num_layers"]),
    )


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any],
                     source: str) -> Any:
    """Map GGUF metadata (and which tensors exist) onto a DecoderConfig (or, for a llama file
    with experts, as llama.cpp writes Mixtral, onto the mixture-of-experts family's config)."""
    arch = fields["general.architecture"]
    if arch == "llama" and fields.get("llama.expert_count"):
        return _moe_family().config_from_gguf(fields, tensors, source)
    reader = ConfigReader(fields, source, prefix=f"{arch}.")
    for key in ("embedding_length", "attention.head_count", "block_count"):
        if isinstance(reader.value(key), list):
            raise reader.fail(key, "is per layer, which is not supported")
    shape = gguf_decoder_shape(reader, fields, tensors, max_position_embeddings=2048)
    head_dim, layers = shape["head_dim"], shape["num_layers"]
    if reader.int("rope.dimension_count", head_dim) != head_dim:
        raise reader.fail("rope.dimension_count", f"is a partial rotary embedding (of "
                          f"{head_dim} dimensions), which is not supported")
    theta = reader.float("rope.freq_base", 10000.0)
    scaling = gguf_rope_scaling(reader)
    if ROPE_FACTORS in tensors:
        if scaling is not None:
            raise ConfigError(f"{source}: both rope scaling metadata and {ROPE_FACTORS}")
        original = reader.int("rope.scaling.original_context_length", 8192)
        factors = np.asarray(tensors[ROPE_FACTORS], dtype=np.float64).reshape(-1)
        scaling = llama3_scaling_from_factors(factors, head_dim, theta, original, source)
    return DecoderConfig(
        **shape,
        model_type=arch,
        rope_theta=theta,
        rope_scaling=scaling,
        attention_bias="blk.0.attn_q.bias" in tensors,
        attention_output_bias="blk.0.attn_output.bias" in tensors,
        mlp_bias="blk.0.ffn_up.bias" in tensors,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        sliding_windows=(reader.int("attention.sliding_window", 0, minimum=0),) * layers,
    )


def llama3_scaling_from_factors(factors: np.ndarray, head_dim: int, theta: float,
                                original_context: int, source: str = "<gguf>"
                                ) -> RopeScaling | None:
    """Recover llama3 rope scaling from llama.cpp's per-frequency factors (rope_freqs.weight).

    Factors are 1 for high frequencies, `factor` for low ones and smoothly in between; only
    low_freq_factor / original and high_freq_factor / original are identifiable, so the original
    context is taken as given and the two factors are fitted, then checked against every factor."""
    if factors.shape != (head_dim // 2,):
        raise ConfigError(f"{source}: {ROPE_FACTORS} has {factors.size} entries, expected "
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
    if not np.allclose(inv_freq / rope_frequencies(head_dim, theta, scaling), factors,
                       rtol=1e-4, atol=0):
        raise ConfigError(f"{source}: {ROPE_FACTORS} does not follow llama3 rope scaling; "
                          "these per-frequency factors are not supported")
    return scaling


def gguf_tensors(config: DecoderConfig, tensors: Mapping[str, Any],
                 source: str) -> Mapping[str, Any]:
    if not isinstance(config, DecoderConfig):  # a llama file with experts
        return _moe_family().gguf_tensors(config, tensors, source)
    transform = None
    if config.model_type == "llama":
        orders = {"q": rope_row_order(config.num_heads, config.head_dim),
                  "k": rope_row_order(config.num_kv_heads, config.head_dim)}

        def transform(gguf_name: str, value: Any) -> Any:
            rotated = _ROTATED_TENSOR.fullmatch(gguf_name)
            return value if rotated is None else take_rows(value, orders[rotated.group(1)])

    return RenamedTensors(tensors, NAMES, source, transform, ignored=(ROPE_FACTORS,))


def build(config: DecoderConfig, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> DecoderModel:
    if not isinstance(config, DecoderConfig):  # a llama file with experts
        return _moe_family().build(config, tensors, backend, max_context)
    return transformer_model(config, tensors, backend, max_context, NAMES)


def tensor_parallel(config: Any) -> TensorParallelSplit | None:
    """Attention by heads, the rest by columns; a llama file with experts splits as the
    mixture-of-experts family says."""
    if not isinstance(config, DecoderConfig):
        return _moe_family().tensor_parallel(config)
    return TensorParallelSplit(heads=NAMES)


def _moe_family() -> Family:
    """The family of Mixtral, whose GGUF files llama.cpp writes as llama files with experts."""
    return family_for_model_type("mixtral", "<registry>")


FAMILY = Family(
    name="llama",
    model_types=("llama", "mistral", "qwen2", "qwen3"),
    gguf_architectures=("llama", "qwen2", "qwen3"),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: tensors,
    gguf_tensors=gguf_tensors,
    build=build,
    tensor_parallel=tensor_parallel,
)
