"""The gemma4 family (the text model of Gemma 4): config mapping, tensor names and the model.

Invariant: a Gemma 4 checkpoint (`gemma4_text`, or `gemma4` with its `text_config`, whose
text tensors live under model.language_model.) reaches Gemma4Model with every choice that sets
it apart from Gemma 3 made explicit:
- RMS norm weights used as stored (Gemma 3 uses 1 + w), and a weightless norm on the values;
- q/k norms, and scores scaled by 1 (no query_pre_attn_scalar);
- global (full attention) layers with their own head size (per_layer_config, else
  global_head_dim, default 512) and, where attention_k_eq_v, their own KV head count
  (num_global_key_value_heads) and values equal to the keys' projection;
- rope per layer type: `default` over the layer's head size, or `proportional` (the first
  partial_rotary_factor * head_dim / 2 frequencies of the full head size, the rest 0, all
  divided by `factor`), rotating pairs (i, i + D/2) of the whole head;
- the last num_kv_shared_layers layers compute no keys or values: each reads the KV slot of
  the last earlier layer of its type, and with use_double_wide_mlp has an MLP twice as wide;
- per-layer input embeddings (hidden_size_per_layer_input), each layer's output scalar, a
  mixture of experts beside the dense MLP (enable_moe_block), and soft-capped logits;
- the last layer is global, as transformers forces it.
Embeddings are scaled by float32(sqrt(hidden)) and tied to the output unless the config says
otherwise. Bidirectional attention over every token ("all") and attention biases are refused.
GGUF files (llama.cpp's `gemma4` architecture) are read by gemma4_gguf.py into the same config
and names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from exactdraft.errors import ConfigError
from exactdraft.formats.table import stack_rows
from exactdraft.models.blocks import RopeTable
from exactdraft.models.config import ConfigReader
from exactdraft.models.decoder import Trunk
from exactdraft.models.families.gemma4_config import (
    DEFAULT_ROPE,
    GLOBAL,
    SLIDING,
    SLIDING_PATTERN,
    Gemma4Config,
    LayerRope,
    kv_sources,
)
from exactdraft.models.families.gemma4_gguf import config_from_gguf, gguf_tensors
from exactdraft.models.families.registry import Family
from exactdraft.models.gemma4_layers import (
    Gemma4Layer,
    Gemma4Model,
    PerLayerGate,
    PerLayerInputs,
    ScaledExperts,
    SharedKVAttention,
)
from exactdraft.models.mixers import DenseMLP, dense_mlp, norm_vector
from exactdraft.models.moe import RouterSettings, load_experts
from exactdraft.models.recurrent import F32
from exactdraft.models.split import TensorParallelSplit
from exactdraft.models.tensors import TensorReader

TEXT_PREFIXES = ("model.language_model.", "model.")  # nested (multimodal) checkpoints first


def config_from_hf(raw: Mapping[str, Any], source: str) -> Gemma4Config:
    """A Gemma 4 text config: `gemma4_text`, or `gemma4` with its `text_config` (the vision
    and audio parts are ignored)."""
    if raw.get("model_type") == "gemma4":
        text = raw.get("text_config")
        if not isinstance(text, Mapping):
            raise ConfigError(f"{source}: a gemma4 config needs a text_config object")
        raw = {**text, "model_type": "gemma4_text"}
    reader = ConfigReader(raw, source)
    activation = reader.value("hidden_activation", reader.value("hidden_act", "gelu_pytorch_tanh"))
    if activation not in ("gelu_pytorch_tanh", "gelu_tanh"):
        raise reader.fail("hidden_activation", f"{activation!r} is not supported; supported: "
                          "gelu_pytorch_tanh")
    if reader.value("use_bidirectional_attention", None) == "all":
        raise reader.fail("use_bidirectional_attention", "'all' (non-causal attention) cannot "
                          "generate; supported: null, 'vision'")
    if reader.bool("attention_bias", False):
        raise reader.fail("attention_bias", "(attention biases) is not supported")
    hidden, heads = reader.int("hidden_size"), reader.int("num_attention_heads")
    layers = reader.int("num_hidden_layers")
    sliding = _sliding_layers(reader, layers)
    head_dims, kv_heads = _head_shapes(reader, sliding, heads)
    keys_are_values = reader.bool("attention_k_eq_v", False)
    per_layer_size = reader.int("hidden_size_per_layer_input", 0, minimum=0)
    experts = reader.bool("enable_moe_block", False)
    softcap = reader.float("final_logit_softcapping", None)
    if experts and reader.int("top_k_experts") > reader.int("num_experts"):
        raise reader.fail("top_k_experts", f"({reader.int('top_k_experts')}) exceeds the "
                          f"{reader.int('num_experts')} experts")
    return Gemma4Config(
        model_type="gemma4_text", source=source, vocab_size=reader.int("vocab_size"),
        hidden_size=hidden, intermediate_size=reader.int("intermediate_size"),
        num_layers=layers, num_heads=heads, sliding=sliding, head_dims=head_dims,
        kv_heads=kv_heads,
        kv_sources=kv_sources(reader, sliding, reader.int("num_kv_shared_layers", 0, 0)),
        sliding_window=reader.int("sliding_window", 512),
        ropes=_ropes(reader), rms_norm_eps=reader.float("rms_norm_eps", 1e-6),
        max_position_embeddings=reader.int("max_position_embeddings", 131072),
        tie_word_embeddings=reader.bool("tie_word_embeddings", True),
        eos_token_ids=reader.token_ids("eos_token_id"),
        bos_token_id=reader.int("bos_token_id", None, minimum=0),
        keys_are_values=keys_are_values,
        double_wide_mlp=reader.bool("use_double_wide_mlp", False),
        per_layer_size=per_layer_size,
        per_layer_vocab=reader.int("vocab_size_per_layer_input", 262144)
        if per_layer_size else 0,
        num_experts=reader.int("num_experts") if experts else 0,
        top_k=reader.int("top_k_experts") if experts else 0,
        expert_size=reader.int("moe_intermediate_size") if experts else 0,
        final_logit_softcapping=softcap)


def _sliding_layers(reader: ConfigReader, layers: int) -> tuple[bool, ...]:
    """True for each sliding-window layer, from layer_types or the 5:1 pattern; the last layer
    is global whatever the config says (as transformers makes it)."""
    layer_types = reader.value("layer_types", None)
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != layers or any(
                kind not in (SLIDING, GLOBAL) for kind in layer_types):
            raise reader.fail("layer_types", f"must list {SLIDING} or {GLOBAL} for each of "
                              f"the {layers} layers, got {layer_types!r}")
        sliding = [kind == SLIDING for kind in layer_types]
    else:
        sliding = [(i + 1) % SLIDING_PATTERN != 0 for i in range(layers)]
    sliding[-1] = False
    return tuple(sliding)


def _head_shapes(reader: ConfigReader, sliding: tuple[bool, ...], heads: int
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per layer (head size, KV heads): the config's, with global layers overridden by
    per_layer_config (as transformers writes it) or global_head_dim and, where
    attention_k_eq_v, num_global_key_value_heads."""
    head_dim = reader.int("head_dim", reader.int("hidden_size") // heads)
    kv = reader.int("num_key_value_heads", heads)
    overrides = reader.value("per_layer_config", None)
    if overrides is None:
        shared = {"head_dim": reader.int("global_head_dim", 512)}
        if reader.bool("attention_k_eq_v", False) and reader.has("num_global_key_value_heads"):
            shared["num_key_value_heads"] = reader.int("num_global_key_value_heads")
        overrides = {str(i): shared for i, is_sliding in enumerate(sliding) if not is_sliding}
    if not isinstance(overrides, Mapping):
        raise reader.fail("per_layer_config", f"must be an object, got {overrides!r}")
    dims, kv_heads = [], []
    for i in range(len(sliding)):
        layer = ConfigReader(overrides.get(str(i), {}),
                             f"{reader.source}: per_layer_config[{i!r}]")
        unknown = set(layer.raw) - {"head_dim", "num_key_value_heads"}
        if unknown:
            raise layer.fail(sorted(unknown)[0], "is not supported per layer; supported: "
                             "head_dim, num_key_value_heads")
        dims.append(layer.int("head_dim", head_dim))
        kv_heads.append(layer.int("num_key_value_heads", kv))
        if dims[-1] % 2 or heads % kv_heads[-1]:
            raise ConfigError(f"{reader.source}: layer {i} has head size {dims[-1]} and "
                              f"{kv_heads[-1]} KV heads for {heads} query heads; the head size "
                              "must be even and the KV heads divide the query heads")
    return tuple(dims), tuple(kv_heads)


def _ropes(reader: ConfigReader) -> tuple[LayerRope, LayerRope]:
    parameters = reader.value("rope_parameters", None) or DEFAULT_ROPE
    if not isinstance(parameters, Mapping):
        raise reader.fail("rope_parameters", f"must be an object, got {parameters!r}")
    ropes = []
    for kind in (SLIDING, GLOBAL):
        part = ConfigReader(parameters.get(kind) or DEFAULT_ROPE[kind],
                            f"{reader.source}: rope_parameters[{kind!r}]")
        rope_type = part.value("rope_type", "default")
        theta = part.float("rope_theta", DEFAULT_ROPE[kind]["rope_theta"])
        if rope_type == "default":
            ropes.append(LayerRope(theta))
        elif rope_type == "proportional":
            share = part.float("partial_rotary_factor", 1.0)
            if share > 1.0:
                raise part.fail("partial_rotary_factor", f"must be at most 1, got {share}")
            ropes.append(LayerRope(theta, part.float("factor", 1.0), share))
        else:
            raise part.fail("rope_type", f"{rope_type!r} is not supported; supported: "
                            "default, proportional")
    return ropes[0], ropes[1]


def text_prefix(reader: TensorReader) -> str:
    return next((p for p in TEXT_PREFIXES if reader.has(p + "embed_tokens.weight")),
                TEXT_PREFIXES[-1])


def attention(be: Any, reader: TensorReader, prefix: str, c: Gemma4Config, layer: int,
              slot: int, rope: RopeTable) -> SharedKVAttention:
    hidden, heads, dim = c.hidden_size, c.num_heads, c.head_dims[layer]
    kv_rows = c.kv_heads[layer] * dim
    rows = [reader.get(prefix + "q_proj.weight", (heads * dim, hidden))]
    q_norm = norm_vector(be, reader, prefix + "q_norm.weight", dim)
    writes = c.writes_kv(layer)
    values_are_keys = c.keys_are_values and not c.sliding[layer]
    k_norm = unit = None
    if writes:
        k = reader.get(prefix + "k_proj.weight", (kv_rows, hidden))
        rows.append(k)
        if not values_are_keys:
            rows.append(reader.get(prefix + "v_proj.weight", (kv_rows, hidden)))
        k_norm = norm_vector(be, reader, prefix + "k_norm.weight", dim)
        unit = be.vector(np.ones(dim, dtype=F32))
    return SharedKVAttention(
        qkv=be.matrix(stack_rows(rows)),
        output=be.matrix(reader.get(prefix + "o_proj.weight", (hidden, heads * dim))),
        num_heads=heads, num_kv_heads=c.kv_heads[layer], head_dim=dim, kv_slot=slot,
        eps=c.rms_norm_eps, q_norm=q_norm, rope=rope, writes=writes, k_norm=k_norm,
        unit_norm=unit, window=c.sliding_window if c.sliding[layer] else 0,
        values_are_keys=values_are_keys)


def experts(be: Any, reader: TensorReader, prefix: str, c: Gemma4Config) -> ScaledExperts:
    hidden = c.hidden_size
    router_scale = reader.array(prefix + "router.scale", (hidden,)) * F32(hidden ** -0.5)
    return ScaledExperts(
        router=be.matrix(reader.get(prefix + "router.proj.weight", (c.num_experts, hidden))),
        router_norm=be.vector(router_scale),
        input_norm=norm_vector(be, reader, prefix + "pre_feedforward_layernorm_2.weight",
                               hidden),
        output_norm=norm_vector(be, reader, prefix + "post_feedforward_layernorm_2.weight",
                                hidden),
        settings=RouterSettings(c.num_experts, c.top_k, normalize=True),
        expert_scales=reader.array(prefix + "router.per_expert_scale", (c.num_experts,)),
        experts=expert_mlps(be, reader, prefix + "experts.", c))


def expert_mlps(be: Any, reader: TensorReader, prefix: str, c: Gemma4Config) -> list[DenseMLP]:
    """The experts: one by one with gate and up fused (`{e}.gate_up_proj.weight`, as GGUF
    files are read), or as load_experts reads them (transformers' stacks)."""
    hidden, inner = c.hidden_size, c.expert_size
    if not reader.has(f"{prefix}0.gate_up_proj.weight"):
        return load_experts(be, reader, prefix, c.num_experts, hidden, inner,
                            ("gate_proj", "up_proj", "down_proj"), activation="gelu_tanh")
    return [DenseMLP(be.matrix(reader.get(f"{prefix}{e}.gate_up_proj.weight",
                                          (2 * inner, hidden))),
                     be.matrix(reader.get(f"{prefix}{e}.down_proj.weight", (hidden, inner))),
                     "gelu_tanh") for e in range(c.num_experts)]


def decoder_layer(be: Any, reader: TensorReader, prefix: str, c: Gemma4Config, layer: int,
                  slot: int, rope: RopeTable, inputs: PerLayerInputs | None) -> Gemma4Layer:
    hidden = c.hidden_size

    def norm(name: str, size: int = hidden) -> Any:
        return norm_vector(be, reader, f"{prefix}{name}.weight", size)

    gate = expert_part = dense_output_norm = None
    if c.per_layer_size:
        size = c.per_layer_size
        gate = PerLayerGate(
            gate=be.matrix(reader.get(prefix + "per_layer_input_gate.weight", (size, hidden))),
            projection=be.matrix(reader.get(prefix + "per_layer_projection.weight",
                                            (hidden, size))),
            norm=norm("post_per_layer_input_norm"))
    if c.num_experts:
        expert_part = experts(be, reader, prefix, c)
        dense_output_norm = norm("post_feedforward_layernorm_1")
    scalar = None
    if reader.has(prefix + "layer_scalar"):
        value = reader.array(prefix + "layer_scalar", (1,))
        scalar = None if value[0] == 1.0 else be.vector(value)
    return Gemma4Layer(
        attention_norm=norm("input_layernorm"),
        mixer=attention(be, reader, prefix + "self_attn.", c, layer, slot, rope),
        post_attention_norm=norm("post_attention_layernorm"),
        mlp_norm=norm("pre_feedforward_layernorm"),
        feed_forward=dense_mlp(be, reader, prefix + "mlp.", hidden, c.mlp_size(layer),
                      activation="gelu_tanh"),
        post_mlp_norm=norm("post_feedforward_layernorm"), index=layer,
        dense_output_norm=dense_output_norm, experts=expert_part, per_layer_gate=gate,
        per_layer_inputs=inputs, scalar=scalar)


def build(config: Gemma4Config, tensors: Mapping[str, Any], backend: Any,
          max_context: int | None = None) -> Gemma4Model:
    c, be = config, backend
    reader = TensorReader(tensors, c.source)
    text = text_prefix(reader)
    hidden = c.hidden_size
    inputs = None
    if c.per_layer_size:
        width = c.num_layers * c.per_layer_size
        inputs = PerLayerInputs(
            table=reader.get(text + "embed_tokens_per_layer.weight",
                             (c.per_layer_vocab, width)),
            projection=be.matrix(reader.get(text + "per_layer_model_projection.weight",
                                            (width, hidden))),
            norm=norm_vector(be, reader, text + "per_layer_projection_norm.weight",
                             c.per_layer_size),
            layers=c.num_layers, size=c.per_layer_size, hidden_size=hidden,
            eps=c.rms_norm_eps)
    tables: dict[tuple[bool, int], RopeTable] = {}
    slots: dict[int, int] = {}
    shapes: list[tuple[int, int]] = []
    layers = []
    for i in range(c.num_layers):
        key = (c.sliding[i], c.head_dims[i])
        if key not in tables:
            tables[key] = RopeTable(c.ropes[0 if c.sliding[i] else 1].frequencies(key[1]))
        if c.writes_kv(i):
            slots[i] = len(shapes)
            shapes.append((c.kv_heads[i], c.head_dims[i]))
        layers.append(decoder_layer(be, reader, f"{text}layers.{i}.", c, i,
                                    slots[c.kv_sources[i]], tables[key], inputs))
    # Tables stay as stored (blocks stay blocks): a pass decodes only its rows.
    embedding = reader.get(text + "embed_tokens.weight", (c.vocab_size, hidden))
    output = embedding if c.tie_word_embeddings else \
        reader.get("lm_head.weight", (c.vocab_size, hidden))
    trunk = Trunk(
        model_type=c.model_type, source=c.source, vocab_size=c.vocab_size,
        max_position_embeddings=c.max_position_embeddings, eos_token_ids=c.eos_token_ids,
        eps=c.rms_norm_eps, hidden_size=hidden, embedding=embedding,
        final_norm=norm_vector(be, reader, text + "norm.weight", hidden),
        lm_head=be.matrix(output), layers=layers, kv_layers=len(shapes),
        num_kv_heads=shapes[0][0], head_dim=shapes[0][1], digest=reader.digest,
        output_table=lambda: output, config=c,
        embedding_scale=float(np.float32(math.sqrt(hidden))),
        kv_prefixes=len(set(shapes)) == 1, verifies_trees=True)
    return Gemma4Model(trunk, be, max_context, shapes, inputs, c.final_logit_softcapping)


FAMILY = Family(
    name="gemma4",
    model_types=("gemma4_text", "gemma4"),
    gguf_architectures=("gemma4",),
    config_from_hf=config_from_hf,
    config_from_gguf=config_from_gguf,
    hf_tensors=lambda config, tensors: tensors,
    gguf_tensors=gguf_tensors,
    build=build,
    # Every matrix splits by output columns; every rank attends with every head (the layers'
    # head counts and sizes differ, and the last layers read earlier layers' keys).
    tensor_parallel=lambda config: TensorParallelSplit(),
)
