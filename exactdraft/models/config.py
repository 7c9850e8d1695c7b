"""DecoderConfig: what a decoder-only model needs to be built, checked once at load.

Invariant: a DecoderConfig holds everything a model needs to build and run, and nothing about
where it came from except the file's name for messages. Family modules map Hugging Face
config.json files and GGUF metadata onto it through ConfigReader, which refuses a missing or
ill-typed key with the file and the key named before any arithmetic uses it; so a bad checkpoint
fails at load with a ConfigError, never with a ZeroDivisionError deep inside a forward pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exactdraft.errors import ConfigError

ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling: rope_type "llama3" (Llama 3.1 style) or "linear"."""

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class DecoderConfig:
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
    activation: str = "silu"  # of the gated MLP: "silu" or "gelu_tanh"
    # Scores are q.k times this (None: head_dim ** -0.5).
    attention_scale: float | None = None
    # The embedding rows are multiplied by this float32 value (None: not scaled).
    embedding_scale: float | None = None
    # Norms after attention and after the MLP, before each residual add (Gemma's sandwich).
    sandwich_norms: bool = False
    # Rope base of the sliding-window layers, where it differs from rope_theta (their rope is
    # then unscaled).
    local_rope_theta: float | None = None
    source: str = "<config>"  # the file the config came from, for messages

    def __post_init__(self) -> None:
        def fail(message: str) -> None:
            raise ConfigError(f"{self.source}: {message}")

        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                fail(f"{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            fail(f"num_heads ({self.num_heads}) is not a multiple of num_kv_heads "
                 f"({self.num_kv_heads})")
        if self.head_dim % 2:
            fail(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not (isinstance(value, float) and math.isfinite(value) and value > 0):
                fail(f"{name} must be a positive number, got {value!r}")
        if self.local_rope_theta is not None and not (math.isfinite(self.local_rope_theta)
                                                      and self.local_rope_theta > 0):
            fail(f"local_rope_theta must be a positive number, got {self.local_rope_theta!r}")
        if self.activation not in ACTIVATIONS:
            fail(f"unsupported activation {self.activation!r}; supported: "
                 f"{', '.join(ACTIVATIONS)}")
        for name in ("attention_scale", "embedding_scale"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                fail(f"{name} must be a positive number, got {value!r}")
        if not self.sliding_windows:
            object.__setattr__(self, "sliding_windows", (0,) * self.num_layers)
        if len(self.sliding_windows) != self.num_layers:
            fail(f"{len(self.sliding_windows)} sliding windows given for {self.num_layers} "
                 "layers")
        if any(isinstance(w, bool) or not isinstance(w, int) or w < 0
               for w in self.sliding_windows):
            fail(f"sliding windows must be integers >= 0, got {self.sliding_windows}")
        for token in (self.bos_token_id, *self.eos_token_ids):
            if token is not None and not 0 <= token < self.vocab_size:
                fail(f"special token id {token} is outside the vocabulary [0, "
                     f"{self.vocab_size})")

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (grouped-query attention)."""
        return self.num_heads // self.num_kv_heads

    @property
    def scale(self) -> float:
        """The attention score scale."""
        return self.attention_scale or 1.0 / math.sqrt(self.head_dim)


class ConfigReader:
    """Typed, checked reads of a raw configuration mapping; every error names the file and key.

    `prefix` is prepended to every key (GGUF metadata keys are `<architecture>.<name>`)."""

    _MISSING = object()

    def __init__(self, raw: Mapping[str, Any], source: str, prefix: str = "") -> None:
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{source}: the configuration must be a JSON object, got "
                              f"{type(raw).__name__}")
        self.raw, self.source, self.prefix = raw, source, prefix

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self.prefix}{key} {message}")

    def has(self, key: str) -> bool:
        return self.raw.get(self.prefix + key) is not None

    def value(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw.get(self.prefix + key)
        if value is None:
            if default is self._MISSING:
                raise ConfigError(f"{self.source}: the configuration has no "
                                  f"{self.prefix + key!r}")
            return default
        return value

    def int(self, key: str, default: Any = _MISSING, minimum: int = 1) -> int:
        value = self.value(key, default)
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {value}")
        return int(value)

    def float(self, key: str, default: Any = _MISSING, positive: bool = True) -> float:
        value = self.value(key, default)
        if value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or (positive and value <= 0):
            kind = "a positive number" if positive else "a finite number"
            raise self.fail(key, f"must be {kind}, got {value!r}")
        return float(value)

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.value(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {value!r}")
        return value

    def token_ids(self, key: str) -> tuple[int, ...]:
        """A token id or a list of them (eos in config.json may be either)."""
        value = self.value(key, None)
        values = value if isinstance(value, list) else ([] if value is None else [value])
        for item in values:
            if isinstance(item, bool) or not isinstance(item, int) or item < 0:
                raise self.fail(key, f"must hold token ids, got {value!r}")
        return tuple(int(v) for v in values)


def rope_scaling_from_hf(reader: ConfigReader) -> RopeScaling | None:
    """llama3 or linear rope scaling from config.json (`rope_parameters` in transformers 5,
    `rope_scaling` before)."""
    parameters = reader.value("rope_parameters", {}) or {}
    legacy = reader.value("rope_scaling", {}) or {}
    for name, part in (("rope_parameters", parameters), ("rope_scaling", legacy)):
        if not isinstance(part, Mapping):
            raise reader.fail(name, f"must be an object, got {part!r}")
    raw = parameters if parameters.get("rope_type", "default") != "default" else legacy
    rope_type = raw.get("rope_type", raw.get("type"))
    if rope_type in (None, "default"):
        return None
    if rope_type not in ("llama3", "linear"):
        raise reader.fail("rope_scaling", f"has unsupported type {rope_type!r}; supported: "
                          "llama3, linear")
    scaling = ConfigReader(raw, reader.source)
    return RopeScaling(
        rope_type=rope_type,
        factor=scaling.float("factor", 1.0),
        low_freq_factor=scaling.float("low_freq_factor", 1.0),
        high_freq_factor=scaling.float("high_freq_factor", 4.0),
        original_max_position_embeddings=scaling.int("original_max_position_embeddings", 8192),
    )


def rope_theta_from_hf(reader: ConfigReader, default: float = 10000.0) -> float:
    parameters = reader.value("rope_parameters", {}) or {}
    if isinstance(parameters, Mapping) and parameters.get("rope_theta") is not None:
        return ConfigReader(parameters, reader.source).float("rope_theta")
    return reader.float("rope_theta", default)


def sliding_windows_from_hf(reader: ConfigReader, num_layers: int) -> tuple[int, ...]:
    """Per-layer windows from sliding_window, use_sliding_window and layer_types."""
    window = reader.int("sliding_window", 0, minimum=0)
    if reader.value("use_sliding_window", None) is False:
        window = 0
    layer_types = reader.value("layer_types", None)
    if layer_types:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise reader.fail("layer_types", f"must list one type for each of the {num_layers} "
                              f"layers, got {layer_types!r}")
        return tuple(window if kind == "sliding_attention" else 0 for kind in layer_types)
    return (window,) * num_layers


def hf_decoder_shape(reader: ConfigReader, max_position_embeddings: int,
                     tie_word_embeddings: bool) -> dict[str, Any]:
    """The DecoderConfig fields every Hugging Face decoder config states the same way (sizes,
    head counts, norm epsilon, context, tied embeddings, special tokens), read from `reader`;
    the two arguments are the family's defaults for the keys a config may leave out."""
    hidden = reader.int("hidden_size")
    heads = reader.int("num_attention_heads")
    layers = reader.int("num_hidden_layers")
    return dict(
        vocab_size=reader.int("vocab_size"), hidden_size=hidden,
        intermediate_size=reader.int("intermediate_size"), num_layers=layers, num_heads=heads,
        num_kv_heads=reader.int("num_key_value_heads", heads),
        head_dim=reader.int("head_dim", hidden // heads),
        rms_norm_eps=reader.float("rms_norm_eps", 1e-6),
        max_position_embeddings=reader.int("max_position_embeddings",
                                           max_position_embeddings),
        tie_word_embeddings=reader.bool("tie_word_embeddings", tie_word_embeddings),
        bos_token_id=reader.int("bos_token_id", None, minimum=0),
        eos_token_ids=reader.token_ids("eos_token_id"), source=reader.source)
