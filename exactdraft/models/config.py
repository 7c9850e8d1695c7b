"""One ModelConfig for every supported decoder-only family.

Invariant: a ModelConfig holds everything the Target needs to build and run a model, and nothing
about where it came from. Hugging Face config.json files and GGUF metadata both map onto it, so
model code never reads a raw config again. Values are checked here, once, so a bad checkpoint
fails at load with the offending key named instead of deep inside a forward pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class ConfigError(ValueError):
    """A checkpoint's configuration cannot be used; the message names the key and value."""


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling: rope_type "llama3" (Llama 3.1 style) or "linear"."""

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    attention_output_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    # One entry per layer: 0 for full attention, W for a sliding window of W keys (the query's
    # own key included), matching Hugging Face's `q - k < W` mask.
    sliding_windows: tuple[int, ...] = field(default=())
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"unsupported model_type {self.model_type!r}; supported: "
                + ", ".join(SUPPORTED_MODEL_TYPES)
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) is not a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not (self.rope_theta > 0 and math.isfinite(self.rope_theta)):
            raise ConfigError(f"rope_theta must be a positive number, got {self.rope_theta!r}")
        if not self.sliding_windows:
            object.__setattr__(self, "sliding_windows", (0,) * self.num_layers)
        if len(self.sliding_windows) != self.num_layers:
            raise ConfigError(
                f"{len(self.sliding_windows)} sliding windows given for {self.num_layers} layers"
            )

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Map a Hugging Face config.json (transformers 4.x or 5.x layout) onto a ModelConfig."""
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ConfigError(
                f"unsupported model_type {model_type!r}; supported: "
                + ", ".join(SUPPORTED_MODEL_TYPES)
            )
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"):
            if key not in raw:
                raise ConfigError(f"config.json has no {key!r}")
        if raw.get("hidden_act", "silu") not in ("silu", "swish"):
            raise ConfigError(f"unsupported hidden_act {raw['hidden_act']!r}; supported: silu")
        num_heads = raw["num_attention_heads"]
        num_layers = raw["num_hidden_layers"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // num_heads
        rope = dict(raw.get("rope_parameters") or {})
        legacy_scaling = raw.get("rope_scaling") or {}
        rope_theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        scaling = _rope_scaling(rope if rope.get("rope_type", "default") != "default"
                                else legacy_scaling)
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
            attention_output_bias=model_type != "qwen2" and bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=model_type == "qwen3",
            sliding_windows=_sliding_windows(raw, num_layers),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _rope_scaling(raw: dict[str, Any]) -> RopeScaling | None:
    rope_type = raw.get("rope_type", raw.get("type"))
    if rope_type in (None, "default"):
        return None
    if rope_type not in ("llama3", "linear"):
        raise ConfigError(f"unsupported rope scaling type {rope_type!r}; supported: llama3, linear")
    return RopeScaling(
        rope_type=rope_type,
        factor=float(raw.get("factor", 1.0)),
        low_freq_factor=float(raw.get("low_freq_factor", 1.0)),
        high_freq_factor=float(raw.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(raw.get("original_max_position_embeddings", 8192)),
    )


def _sliding_windows(raw: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    window = raw.get("sliding_window") or 0
    if raw.get("use_sliding_window") is False:
        window = 0
    layer_types = raw.get("layer_types")
    if layer_types:
        if len(layer_types) != num_layers:
            raise ConfigError(f"layer_types has {len(layer_types)} entries for {num_layers} layers")
        return tuple(window if kind == "sliding_attention" else 0 for kind in layer_types)
    return (window,) * num_layers
