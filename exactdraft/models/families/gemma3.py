"""The gemma3 family (the text model of Gemma 3): config mapping, tensor names and the model.

Invariant: a Gemma 3 checkpoint reaches DecoderModel as transformer layers, each the layer the
DecoderLayer docstring describes, with Gemma's choices made explicit: embeddings times
float32(sqrt(hidden)), RMS norm weights used as (1 + w) (Hugging Face stores w and applies
1 + w in float32; llama.cpp's converter stores 1 + w already, so GGUF weights are used as
they are), norms before and after attention and the MLP, q/k norms, GELU-tanh gating, scores
scaled by query_pre_attn_scalar**-0.5, sliding-window layers with their own unscaled rope base
beside global layers with the global base and scaling, and tied embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from exactdraft.errors import ConfigError
from exactdraft.models.config import (
    ConfigReader,
    DecoderConfig,
    RopeScaling,
    hf_decoder_shape,
)
from exactdraft.models.decoder import DecoderModel
from exactdraft.models.families.registry import Family
from exactdraft.models.gguf_names import (
    RenamedTensors,
    gguf_decoder_shape,
)
from exactdraft.models.split import TensorParallelSplit
from exactdraft.models.transformer import TensorNames, transformer_model

NAMES = TensorNames(
    post_attention_norm="model.layers.{i}.post_attention_layernorm.weight",
    mlp_norm="model.layers.{i}.pre_feedforward_layernorm.weight",
    post_mlp_norm="model.layers.{i}.post_feedforward_layernorm.weight",
)
LOCAL_ROPE_THETA = 10000.0  # llama.cpp's and transformers' default for the sliding layers
SLIDING_PATTERN = 6  # every sixth layer is global unless the checkpoint says otherwise
# Where multimodal Gemma 3 checkpoints keep the text model's tensors.
TEXT_PREFIXES = ("model.language_model.", "language_model.model.")


def config_from_hf(raw: Mapping[str, Any], source: str) -> DecoderConfig:
    """A Gemma 3 text config: `gemma3_text`, or `gemma3` with its `text_config` (the vision
    part is ignored)."""
    if raw.get("model_type") == "gemma3":
        text = raw.get("text_config")
        if not isinstance(text, Mapping):
            raise ConfigError(f"{source}: a gemma3 config needs a text_config object")
        raw = {**text, "model_type": "gemma3_text"}
    reader = ConfigReader(raw, source)
    activation = reader.value("hidden_activation", reader.value("hidden_act", "gelu_pytorch_tanh"))
    if activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise reader.fail("hidden_activation", f"{activation!r} is not supported; supported: "
                          "gelu_pytorch_tanh")
    if reader.value("final_logit_softcapping", None) is not None:
        raise reader.fail("final_logit_softcapping", "(logit soft-capping) is not supported")
    shape = hf_decoder_shape(reader, max_position_embeddings=131072, tie_word_embeddings=True)
    window = reader.int("sliding_window", 4096)
    kinds = _layer_kinds(reader, shape["num_layers"])
    global_theta, local_theta, scaling = _rope_from_hf(reader)
    return DecoderConfig(
        **shape,
        model_type="gemma3_text",
        rope_theta=global_theta,
        rope_scaling=scaling,
        attention_bias=reader.bool("attention_bias", False),
        attention_output_bias=reader.bool("attention_bias", False),
        qk_norm=True,
        sliding_windows=tuple(window if sliding else 0 for sliding in kinds),
        activation="gelu_tanh",
        attention_scale=1.0 / math.sqrt(reader.float("query_pre_attn_scalar",
                                                     shape["head_dim"])),
        embedding_scale=float(np.float32(math.sqrt(shape["hidden_size"]))),
        sandwich_norms=True,
        local_rope_theta=local_theta,
    )


def _layer_kinds(reader: ConfigReader, layers: int) -> list[bool]:
    """True for each sliding-window layer: from layer_types, else the legacy pattern."""
    layer_types = reader.value("layer_types", None)
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != layers or any(
                kind not in ("sliding_attention", "full_attention") for kind in layer_types):
            raise reader.fail("layer_types", f"must list sliding_attention or full_attention "
                              f"for each of the {layers} layers, got {layer_types!r}")
        return [kind == "sliding_attention" for kind in layer_types]
    pattern = reader.int("sliding_window_pattern", SLIDING_PATTERN)
    return [(i + 1) % pattern != 0 for i in range(layers)]


def _rope_from_hf(reader: ConfigReader) -> tuple[float, float, RopeScaling | None]:
    """(global base, sliding-layer base, global scaling) from `rope_parameters` keyed by layer
    type (transformers 5) or the legacy rope_theta / rope_local_base_freq / rope_scaling."""
    parameters = reader.value("rope_parameters", None)
    if isinstance(parameters, Mapping) and "full_attention" in parameters:
        full = ConfigReader(parameters["full_attention"] or {}, reader.source)
        local = ConfigReader(parameters.get("sliding_attention") or {}, reader.source)
        if local.value("rope_type", "default") != "default":
            raise reader.fail("rope_parameters", "scales the sliding layers' rope, which is not "
                              "supported")
        return (full.float("rope_theta", 1000000.0), local.float("rope_theta", LOCAL_ROPE_THETA),
                _scaling(full))
    legacy = reader.value("rope_scaling", None) or {}
    return (reader.float("rope_theta", 1000000.0),
            reader.float("rope_local_base_freq", LOCAL_ROPE_THETA),
            _scaling(ConfigReader(legacy, reader.source)))


def _scaling(reader: ConfigReader) -> RopeScaling | None:
    rope_type = reader.value("rope_type", reader.value("type", "default"))
    if rope_type == "default":
        return None
    if rope_type != "linear":
        raise reader.fail("rope_type", f"{rope_type!r} is not supported for gemma3; supported: "
                          "linear")
    factor = reader.float("factor", 1.0)
    return None if factor == 1.0 else RopeScaling("linear", factor=factor)


def config_from_gguf(fields: Mapping[str, Any], tensors: Mapping[str, Any],
                     source: str) -> DecoderConfig:
    """llama.cpp's gemma3 metadata, read as llama.cpp reads it (its converter writes no
    query_pre_attn_scalar, local rope base or sliding pattern: the defaults below are its)."""
    reader = ConfigReader(fields, source, prefix="gemma3.")
    shape = gguf_decoder_shape(reader, fields, tensors, max_position_embeddings=131072)
    hidden, heads, layers = shape["hidden_size"], shape["num_heads"], shape["num_layers"]
    if reader.value("final_logit_softcapping", None):
        raise reader.fail("final_logit_softcapping", "(logit soft-capping) is not supported")
    window = reader.int("attention.sliding_window", 0, minimum=0)
    pattern = reader.value("attention.sliding_window_pattern", SLIDING_PATTERN)
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise reader.fail("attention.sliding_window_pattern", f"has {len(pattern)} entries "
                              f"for {layers} layers")
        sliding = [bool(entry) for entry in pattern]
    else:
        pattern = reader.int("attention.sliding_window_pattern", SLIDING_PATTERN)
        sliding = [(i + 1) % pattern != 0 for i in range(layers)]
    kind = reader.value("rope.scaling.type", None)
    factor = reader.float("rope.scaling.factor", 1.0)
    if kind not in (None, "none", "linear"):
        raise reader.fail("rope.scaling.type", f"{kind!r} is not supported; supported: linear")
    scaling = RopeScaling("linear", factor=factor) if kind == "linear" and factor != 1.0 \
        else None
    # llama.cpp scales the 27B model's scores (62 layers) by hidden / heads instead.
    scale_dim = hidden // heads if layers == 62 else shape["head_dim"]
    return DecoderConfig(
        **shape,
        model_type="gemma3_text",
        rope_theta=reader.float("rope.freq_base", 1000000.0),
        rope_scaling=scaling,
        qk_norm=True,
        sliding_windows=tuple(window if is_sliding else 0 for is_sliding in sliding),
        activation="gelu_tanh",
        attention_scale=1.0 / math.sqrt(scale_dim),
        embedding_scale=float(np.float32(math.sqrt(hidden))),
        sandwich_norms=True,
        local_rope_theta=LOCAL_ROPE_THETA,
    )


class _ShiftedNorms(Mapping):
    """Hugging Face Gemma tensors with every RMS norm weight w given as float32(1) + w, the
    factor transformers applies, and a multimodal checkpoint's text tensors under the text
    model's names."""

    def __init__(self, tensors: Mapping[str, Any]) -> None:
        self.tensors = tensors
        self.source_names = {}
        for name in tensors:
            renamed = name
            for prefix in TEXT_PREFIXES:
                if name.startswith(prefix):
                    renamed = "model." + name[len(prefix):]
            self.source_names[renamed] = name

    def __getitem__(self, name: str) -> Any:
        value = self.tensors[self.source_names[name]]
        if name.endswith("norm.weight"):
            return np.float32(1.0) + np.asarray(value, dtype=np.float32)
        return value

    def shape(self, name: str) -> tuple[int, ...]:
        shape_of = getattr(self.tensors, "shape", None)
        source = self.source_names[name]
        return tuple(shape_of(source)) if callable(shape_of) else \
            tuple(np.shape(self.tensors[source]))

    def __iter__(self) -> Iterator[str]:
        return iter(self.source_names)

    def __len__(self) -> int:
        return len(self.source_names)


def build(config: DecoderConfig, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> DecoderModel:
    return transformer_model(config, tensors, backend, max_context, NAMES)


FAMILY = Family(
    name="gemma3",
    model_types=("gemma3_text", "gemma3"),
    gguf_architectures=("gemma3",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: _ShiftedNorms(tensors),
    gguf_tensors=lambda config, tensors, source: RenamedTensors(tensors, NAMES, source),
    build=build,
    tensor_parallel=lambda config: TensorParallelSplit(heads=NAMES),
)
