"""GGUF files of Gemma 4, written from the tiny transformers checkpoints as llama.cpp's converter
writes them (architecture `gemma4`: its metadata keys, tensor names, rope_freqs for the global
layers' proportional rope, per-layer arrays of KV heads and MLP widths, norms stored as used),
then loaded with exactdraft: an F32 file gives the folder's logits bit for bit, and a missing or
inconsistent field is refused by name."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from exactdraft.errors import ConfigError
from exactdraft.formats import QuantizedTensor
from exactdraft.guard import probe_tokens
from tests.loading.test_gguf_families import (
    q8_0_file_type,
    read_folder,
    stored_values,
    write_file,
)
from tests.models.families.test_gemma4 import VARIANTS, build_gemma4
from tests.models.test_moe import hf_logits, relative_error

gguf = pytest.importorskip("gguf")

GLOBALS = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight",
           "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
           "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
           "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight"}
LAYER_PARTS = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "pre_feedforward_layernorm_2.weight": "pre_ffw_norm_2.weight",
    "post_feedforward_layernorm_1.weight": "post_ffw_norm_1.weight",
    "post_feedforward_layernorm_2.weight": "post_ffw_norm_2.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "router.proj.weight": "ffn_gate_inp.weight",
    "router.scale": "ffn_gate_inp.scale", "router.per_expert_scale": "ffn_down_exps.scale",
    "experts.gate_up_proj": "ffn_gate_up_exps.weight",
    "experts.down_proj": "ffn_down_exps.weight", "layer_scalar": "layer_output_scale.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight"}


def gguf_name(name: str) -> str:
    if name in GLOBALS:
        return GLOBALS[name]
    layer, part = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name).groups()
    return f"blk.{layer}.{LAYER_PARTS[part]}"


def convert(folder: str, path: str, drop: tuple[str, ...] = (),
            tensors_changed: dict | None = None, quantized: bool = False, **changed) -> str:
    """The file llama.cpp's converter writes for the folder (`changed` metadata values and
    `tensors_changed` replacing the converter's, the fields in `drop` left out)."""
    config, state = read_folder(folder)
    layers, arch = config["num_hidden_layers"], "gemma4"
    sliding = [kind == "sliding_attention" for kind in
               config["layer_types"] or []] or [True] * (layers - 1) + [False]
    full = config["per_layer_config"][str(sliding.index(False))]
    head_dim_full = full["head_dim"]
    kv = [config["num_key_value_heads"] if s else full.get("num_key_value_heads",
                                                           config["num_key_value_heads"])
          for s in sliding]
    first_shared = layers - config["num_kv_shared_layers"]
    widths = [config["intermediate_size"] * (2 if config["use_double_wide_mlp"] and
                                             i >= first_shared else 1) for i in range(layers)]
    rope = config["rope_parameters"]
    tensors = {gguf_name(name): value for name, value in state.items()}
    if rope["full_attention"]["rope_type"] == "proportional":
        rotated = int(head_dim_full * rope["full_attention"]["partial_rotary_factor"] / 2)
        tensors["rope_freqs.weight"] = np.array(
            [1.0] * rotated + [1e30] * (head_dim_full // 2 - rotated), np.float32)
    values = {
        "block_count": layers, "context_length": config["max_position_embeddings"],
        "embedding_length": config["hidden_size"],
        "feed_forward_length": widths if len(set(widths)) > 1 else widths[0],
        "attention.head_count": config["num_attention_heads"],
        "attention.head_count_kv": kv if len(set(kv)) > 1 else kv[0],
        "attention.key_length": head_dim_full, "attention.value_length": head_dim_full,
        "attention.key_length_swa": config["head_dim"],
        "attention.value_length_swa": config["head_dim"],
        "attention.sliding_window": config["sliding_window"],
        "attention.sliding_window_pattern": sliding,
        "attention.shared_kv_layers": config["num_kv_shared_layers"],
        "attention.layer_norm_rms_epsilon": config["rms_norm_eps"],
        "embedding_length_per_layer_input": config["hidden_size_per_layer_input"] or 0,
        "rope.freq_base": rope["full_attention"]["rope_theta"],
        "rope.freq_base_swa": rope["sliding_attention"]["rope_theta"],
        "rope.dimension_count": head_dim_full, "rope.dimension_count_swa": config["head_dim"],
        "final_logit_softcapping": config["final_logit_softcapping"],
        "expert_count": config["num_experts"], "expert_used_count": config["top_k_experts"],
        "expert_feed_forward_length": config["moe_intermediate_size"]}
    values.update(changed)
    tensors.update(tensors_changed or {})
    for key in drop:  # a metadata field or a tensor
        if key in values:
            del values[key]
        else:
            del tensors[key]

    def metadata(writer) -> None:
        for key, value in values.items():
            if value is None:
                continue
            full_key = f"{arch}.{key}"
            if isinstance(value, list):
                writer.add_array(full_key, value)
            elif isinstance(value, float):
                writer.add_float32(full_key, value)
            else:
                writer.add_uint32(full_key, value)
        writer.add_eos_token_id(1)

    return write_file(path, arch, metadata, tensors, quantized)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    return {variant: build_gemma4(str(tmp_path_factory.mktemp(f"gguf-gemma4-{variant}")),
                                  variant) for variant in VARIANTS}


def target_of(path: str):
    from exactdraft.pretrained import build_target, load_checkpoint

    return build_target(load_checkpoint(path), "torch")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_f32_file_gives_the_folders_logits_bit_for_bit(variant, folders, tmp_path):
    ours = target_of(convert(folders[variant], str(tmp_path / "model.gguf")))
    folder = target_of(folders[variant])
    # The file holds eps as float32 and no bos id; everything else maps as from the folder.
    same = {name: getattr(ours.config, name) for name in ("source", "rms_norm_eps",
                                                          "bos_token_id")}
    assert ours.config == dataclasses.replace(folder.config, **same)
    assert ours.config.rms_norm_eps == float(np.float32(folder.config.rms_norm_eps))
    tokens = probe_tokens(40, ours.vocab_size, salt=5)
    got = ours.forward(ours.new_state(), tokens, rows="all")
    want = folder.forward(folder.new_state(), tokens, rows="all")
    assert got.dtype == want.dtype == np.float32 and got.tobytes() == want.tobytes()
    assert ours.eos_token_ids == (1,)


def test_experts_with_gate_and_up_apart_load_alike(folders, tmp_path):
    """llama.cpp's other expert layout (ffn_gate_exps and ffn_up_exps) gives the same bits."""
    _, state = read_folder(folders["full"])
    apart, fused = {}, []
    for layer in range(VARIANTS["full"]["num_hidden_layers"]):
        stack = state[f"model.layers.{layer}.experts.gate_up_proj"]
        inner = stack.shape[1] // 2
        apart[f"blk.{layer}.ffn_gate_exps.weight"] = stack[:, :inner]
        apart[f"blk.{layer}.ffn_up_exps.weight"] = stack[:, inner:]
        fused.append(f"blk.{layer}.ffn_gate_up_exps.weight")
    together = target_of(convert(folders["full"], str(tmp_path / "fused.gguf")))
    separate = target_of(convert(folders["full"], str(tmp_path / "apart.gguf"),
                                 drop=tuple(fused), tensors_changed=apart))
    tokens = probe_tokens(30, together.vocab_size, salt=2)
    assert separate.forward(separate.new_state(), tokens, rows="all").tobytes() == \
        together.forward(together.new_state(), tokens, rows="all").tobytes()


@pytest.mark.parametrize("change,field", [
    (dict(drop=("attention.key_length_swa",)), "key_length_swa"),
    (dict(drop=("attention.sliding_window_pattern",)), "sliding_window_pattern"),
    ({"attention.shared_kv_layers": 5}, "shared_kv_layers"),
    ({"feed_forward_length": [96, 96, 192, 192, 192]}, "feed_forward_length"),
    ({"attention.head_count_kv": [3, 2, 3, 3, 2]}, "head_count_kv"),
    ({"attention.value_length": 16}, "value_length"),
    ({"expert_used_count": 5}, "expert_used_count"),
])
def test_a_missing_or_inconsistent_field_is_named(change, field, folders, tmp_path):
    from exactdraft.pretrained import load_checkpoint

    load_checkpoint(convert(folders["full"], str(tmp_path / "good.gguf")))  # unchanged: loads
    path = convert(folders["full"], str(tmp_path / "bad.gguf"), **change)
    with pytest.raises(ConfigError, match=field):
        load_checkpoint(path)


def test_rope_factors_other_than_llama_cpps_are_refused(folders, tmp_path):
    from exactdraft.pretrained import load_checkpoint

    good = convert(folders["full"], str(tmp_path / "good.gguf"))
    assert load_checkpoint(good).config.ropes[1].rotated_share == 0.25
    factors = np.array([1.0, 2.0] + [1e30] * 14, np.float32)
    path = convert(folders["full"], str(tmp_path / "bad.gguf"),
                   tensors_changed={"rope_freqs.weight": factors})
    with pytest.raises(ConfigError, match="rope_freqs"):
        load_checkpoint(path)


def q8_0_reference(folder: str, destination: str) -> str:
    """A copy of the folder holding the values its Q8_0 file stores (each tensor as the type
    the converter gives it by its GGUF name)."""
    import json
    import os

    from safetensors.numpy import save_file

    config, state = read_folder(folder)
    with open(os.path.join(destination, "config.json"), "w") as handle:
        json.dump(config, handle)
    for name, values in state.items():
        part = re.sub(r"\.(weight|bias|scale)$", "", gguf_name(name)).split(".")[-1]
        state[name] = np.ascontiguousarray(stored_values(values, q8_0_file_type(part, values)))
    save_file(state, os.path.join(destination, "model.safetensors"))
    return destination


def test_q8_0_file_keeps_its_blocks_and_the_reference_logits(folders, tmp_path):
    """Blocks kept (experts included), float activations: within the parity tolerance of
    transformers on the values the file stores; dequantized at load: that folder's bits."""
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.pretrained import build_target, load_checkpoint

    path = convert(folders["full"], str(tmp_path / "model.gguf"), quantized=True)
    checkpoint = load_checkpoint(path)
    kept = {name for name, value in checkpoint.tensors.items()
            if isinstance(value, QuantizedTensor)}
    assert {"model.embed_tokens.weight", "model.layers.0.experts.3.gate_up_proj.weight",
            "model.layers.4.experts.0.down_proj.weight"} <= kept
    (tmp_path / "reference").mkdir()
    reference = q8_0_reference(folders["full"], str(tmp_path / "reference"))
    tokens = probe_tokens(40, checkpoint.config.vocab_size, salt=5)
    ours = build_target(checkpoint, TorchCPUBackend(quantized_activations=False))
    got = ours.forward(ours.new_state(), tokens, rows="all")
    assert relative_error(got, hf_logits(reference, tuple(tokens))) < 2e-5
    dense = target_of_dense(path)
    assert dense.forward(dense.new_state(), tokens, rows="all").tobytes() == \
        target_of(reference).forward(target_of(reference).new_state(), tokens,
                                     rows="all").tobytes()


def target_of_dense(path: str):
    from exactdraft.pretrained import build_target, load_checkpoint

    return build_target(load_checkpoint(path, keep_quantized=False), "torch")
