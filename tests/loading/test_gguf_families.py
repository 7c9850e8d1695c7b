"""GGUF files of the mixture-of-experts and hybrid families, written from the tiny transformers
checkpoints as llama.cpp's converter writes them (its architecture names, tensor names and
layouts: experts stacked [E, rows, K], Mixtral's q/k rows permuted for the interleaved rope,
-exp(A_log) for A, 1 + w for Qwen3-Next's norms, ...), then loaded with exactdraft.

An F32 file gives logits bitwise equal to the Hugging Face folder on the same backend; a Q8_0
file (routers, norms and convolutions kept F32, rows that do not fill 32-weight blocks F16, as
the converter does) stays within Q8_0's error of transformers; a missing metadata field or
tensor is refused with the file and the field named."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from exactdraft.errors import ConfigError, WeightError
from exactdraft.formats import QuantizedTensor
from exactdraft.guard import probe_tokens
from tests.models.test_moe import hf_logits, relative_error

gguf = pytest.importorskip("gguf")

# Q8_0 logits against transformers running the values the file stores, relative to the largest
# logit: the bound the folders' own parity tests use. (Against the unquantized weights the error
# is some 3e-2, and it flips MoE routing, so the reference must run the file's own values.)
Q8_TOLERANCE = 2e-5
TOKENS = 40  # longer than the tiny Mixtral's sliding window of 24

# model.layers.N.<part> -> blk.N.<part>, the names every family here shares.
LAYER_PARTS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
    "block_sparse_moe.gate": "ffn_gate_inp",
}
GLOBALS = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
# Per-expert names -> the stacked tensor they go into.
EXPERT_PARTS = {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                "down_proj": "ffn_down_exps", "w1": "ffn_gate_exps", "w3": "ffn_up_exps",
                "w2": "ffn_down_exps"}
EXPERT = re.compile(r"(.*)\.layers\.(\d+)\.(?:mlp|block_sparse_moe|mixer)\.experts\.(\d+)\."
                    r"(\w+)\.weight")
# Tensors llama.cpp's converter keeps in F32 whatever the output type (conv: LFM2's
# shortconv.conv).
F32_PARTS = ("ffn_gate_inp", "ssm_conv1d", "ssm_a", "ssm_d", "conv")


def read_folder(folder: str) -> tuple[dict, dict[str, np.ndarray]]:
    from safetensors.numpy import load_file

    with open(os.path.join(folder, "config.json")) as handle:
        config = json.load(handle)
    return config, load_file(os.path.join(folder, "model.safetensors"))


def permute_for_rope(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: Hugging Face q/k rows -> the interleaved-rope order it stores."""
    return (rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


def stack_experts(state: dict[str, np.ndarray], rename) -> dict[str, np.ndarray]:
    """The per-expert tensors of `state` stacked as the converter stacks them, the others
    renamed by rename(hf name)."""
    out, experts = {}, {}
    for name, value in state.items():
        match = EXPERT.fullmatch(name)
        if match is None:
            out[rename(name)] = value
            continue
        _, layer, expert, part = match.groups()
        experts.setdefault(f"blk.{layer}.{EXPERT_PARTS[part]}.weight", {})[int(expert)] = value
    for name, by_expert in experts.items():
        out[name] = np.stack([by_expert[e] for e in sorted(by_expert)])
    return out


def layer_rename(name: str, parts: dict[str, str] = LAYER_PARTS) -> str:
    if name in GLOBALS:
        return GLOBALS[name]
    layer, part, kind = re.fullmatch(r"[a-z]+\.layers\.(\d+)\.(.+)\.(weight|bias)",
                                     name).groups()
    return f"blk.{layer}.{parts[part]}.{kind}"


def rope_theta(config: dict) -> float:
    return float((config.get("rope_parameters") or {}).get("rope_theta",
                                                            config.get("rope_theta", 10000.0)))


def q8_0_file_type(part: str, values: np.ndarray) -> str:
    """The type llama.cpp's converter gives a tensor for output type Q8_0."""
    if values.ndim < 2 or part.endswith("norm") or part in F32_PARTS:
        return "F32"
    return "F16" if values.shape[-1] % 32 else "Q8_0"


def stored_values(values: np.ndarray, kind: str) -> np.ndarray:
    """What a tensor of this type gives back (rows are quantized independently)."""
    values = np.ascontiguousarray(values)  # gguf's quantizer reads the buffer as it lies
    if kind == "F16":
        return values.astype(np.float16).astype(np.float32)
    if kind == "Q8_0":
        qtype = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.dequantize(gguf.quants.quantize(values, qtype), qtype)
    return values


def write_file(path: str, arch: str, metadata, tensors: dict[str, np.ndarray],
               quantized: bool, drop: tuple[str, ...] = (), extra: dict | None = None) -> str:
    """metadata(writer) adds the fields; tensors are stored F32, or as the converter's Q8_0
    output type when `quantized`; the fields and tensors named in `drop` are left out, and
    `extra` tensors added."""
    writer = gguf.GGUFWriter(path, arch)
    metadata(writer)
    for key in drop:
        writer.kv_data[0].pop(key, None)
    for name, values in {**tensors, **(extra or {})}.items():
        if name in drop:
            continue
        values = np.ascontiguousarray(values, dtype=np.float32)
        part = re.sub(r"\.(weight|bias)$", "", name).split(".")[-1]
        kind = q8_0_file_type(part, values) if quantized else "F32"
        if kind == "F32":
            writer.add_tensor(name, values)
        elif kind == "F16":
            writer.add_tensor(name, values.astype(np.float16))
        else:
            qtype = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def common_metadata(writer, config: dict, head_dim: int, extra_blocks: int = 0) -> None:
    writer.add_block_count(config["num_hidden_layers"] + extra_blocks)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(rope_theta(config))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_eos_token_id(2)


# -- the converters ---------------------------------------------------------------------------


def convert_moe(folder: str, path: str, quantized: bool, **options) -> str:
    """qwen3_moe as `qwen3moe`; Mixtral as `llama` with experts and q/k permuted for rope."""
    config, state = read_folder(folder)
    mixtral = config["model_type"] == "mixtral"
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    if mixtral:
        for name in state:
            if name.endswith("q_proj.weight"):
                state[name] = permute_for_rope(state[name], heads)
            elif name.endswith("k_proj.weight"):
                state[name] = permute_for_rope(state[name], kv_heads)

    def metadata(writer) -> None:
        common_metadata(writer, config, head_dim)
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_expert_count(config.get("num_experts") or config["num_local_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        if mixtral:
            writer.add_rope_dimension_count(head_dim)
            writer.add_sliding_window(config["sliding_window"])
        else:
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])

    return write_file(path, "llama" if mixtral else "qwen3moe", metadata,
                      stack_experts(state, layer_rename), quantized, **options)


QWEN_PARTS = {**LAYER_PARTS, "post_attention_layernorm": "post_attention_norm",
              "linear_attn.in_proj_qkv": "attn_qkv", "linear_attn.in_proj_z": "attn_gate",
              "linear_attn.in_proj_b": "ssm_beta", "linear_attn.in_proj_a": "ssm_alpha",
              "linear_attn.in_proj_ba": "ssm_ba", "linear_attn.conv1d": "ssm_conv1d",
              "linear_attn.norm": "ssm_norm", "linear_attn.out_proj": "ssm_out",
              "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
              "mlp.shared_expert.up_proj": "ffn_up_shexp",
              "mlp.shared_expert.down_proj": "ffn_down_shexp",
              "mlp.shared_expert_gate": "ffn_gate_inp_shexp"}
QWEN_ARCHITECTURES = {"qwen3_next": "qwen3next", "qwen3_5_text": "qwen35",
                      "qwen3_5_moe_text": "qwen35moe"}


def tiled_value_heads(values: np.ndarray, key_heads: int, value_heads: int, size: int,
                      axis: int = 0) -> np.ndarray:
    """The converter's Qwen3.5 reorder: value heads grouped by key head -> tiled."""
    values = np.moveaxis(values, axis, 0)
    per_key = value_heads // key_heads
    tiled = values.reshape(key_heads, per_key, size, *values.shape[1:]).swapaxes(0, 1)
    return np.ascontiguousarray(np.moveaxis(tiled.reshape(values.shape), 0, axis))


def convert_qwen_hybrid(folder: str, path: str, quantized: bool, **options) -> str:
    """Qwen3-Next as `qwen3next` (in_proj_qkvz split into attn_qkv and attn_gate), Qwen3.5 as
    `qwen35`/`qwen35moe` (value heads tiled); norms as 1 + w (but the gated norm), A_log as
    -exp(A_log), dt_bias as ssm_dt.bias, conv1d squeezed."""
    import torch

    config, state = read_folder(folder)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    next_model = config["model_type"] == "qwen3_next"
    mtp = config.get("mtp_num_hidden_layers", 0)
    state = mtp_as_blocks(state, config["num_hidden_layers"], mtp)
    tensors = {}
    for name, value in state.items():
        if next_model and name.endswith("in_proj_qkvz.weight"):
            group = hv // hk * dv
            q, k, v, z = np.split(value.reshape(hk, 2 * dk + 2 * group, -1),
                                  np.cumsum([dk, dk, group]), axis=1)
            layer = name.split(".")[2]
            tensors[f"blk.{layer}.attn_qkv.weight"] = np.concatenate(
                [part.reshape(-1, value.shape[1]) for part in (q, k, v)])
            tensors[f"blk.{layer}.attn_gate.weight"] = z.reshape(-1, value.shape[1])
            continue
        if name.endswith("conv1d.weight"):
            value = value.squeeze(1)
        if not next_model and hk != hv and ".linear_attn." in name:
            value = tile_linear_attention(name, value, hk, hv, dk, dv)
        if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            value = value + np.float32(1.0)
        layer = name.split(".")[2] if ".layers." in name else None
        if ".nextn." in name:
            tensors[name] = value
        elif name.endswith(".A_log"):
            tensors[f"blk.{layer}.ssm_a"] = -torch.exp(torch.from_numpy(value)).numpy()
        elif name.endswith(".dt_bias"):
            tensors[f"blk.{layer}.ssm_dt.bias"] = value
        else:
            tensors[name] = value
    tensors = stack_experts(tensors, lambda n: n if n.startswith("blk.") else
                            layer_rename(n, QWEN_PARTS))
    layer_types = config["layer_types"]
    interval = layer_types.index("full_attention") + 1
    assert all((i + 1) % interval == 0 for i, kind in enumerate(layer_types)
               if kind == "full_attention")

    def metadata(writer) -> None:
        common_metadata(writer, config, head_dim, mtp)
        if mtp:
            writer.add_nextn_predict_layers(mtp)
        writer.add_feed_forward_length(config["intermediate_size"])
        if "num_experts" in config:
            writer.add_expert_count(config["num_experts"])
            writer.add_expert_used_count(config["num_experts_per_tok"])
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
            writer.add_expert_shared_feed_forward_length(
                config["shared_expert_intermediate_size"])
        writer.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
        writer.add_ssm_state_size(dk)
        writer.add_ssm_group_count(hk)
        writer.add_ssm_time_step_rank(hv)
        writer.add_ssm_inner_size(dv * hv)
        writer.add_full_attention_interval(interval)  # the converter's default 4 would not fit
        rotary = config["rope_parameters"]["partial_rotary_factor"]
        writer.add_rope_dimension_count(int(head_dim * rotary))

    return write_file(path, QWEN_ARCHITECTURES[config["model_type"]], metadata, tensors,
                      quantized, **options)


def mtp_as_blocks(state: dict[str, np.ndarray], layers: int, count: int
                  ) -> dict[str, np.ndarray]:
    """Qwen3.5's `mtp.*` tensors as the converter writes them: the MTP layers as blocks after
    the trunk's, and the head's fc and norms as `nextn.*` tensors of each of those blocks."""
    out = {}
    heads = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm",
             "norm": "shared_head_norm"}
    for name, value in state.items():
        match = re.fullmatch(r"mtp\.layers\.(\d+)\.(.+)", name)
        if match:
            out[f"model.layers.{layers + int(match.group(1))}.{match.group(2)}"] = value
        elif name.startswith("mtp."):
            for block in range(layers, layers + count):
                out[f"blk.{block}.nextn.{heads[name.split('.')[1]]}.weight"] = value
        else:
            out[name] = value
    return out


def tile_linear_attention(name: str, value: np.ndarray, hk: int, hv: int, dk: int,
                          dv: int) -> np.ndarray:
    qk = 2 * hk * dk
    if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
        return np.concatenate([value[:qk], tiled_value_heads(value[qk:], hk, hv, dv)])
    if name.endswith("in_proj_z.weight"):
        return tiled_value_heads(value, hk, hv, dv)
    if name.endswith(("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias")):
        return tiled_value_heads(value, hk, hv, 1)
    if name.endswith("out_proj.weight"):
        return tiled_value_heads(value, hk, hv, dv, axis=1)
    return value


NEMOTRON_PARTS = {"norm": "attn_norm", "mixer.in_proj": "ssm_in", "mixer.out_proj": "ssm_out",
                  "mixer.conv1d": "ssm_conv1d", "mixer.norm": "ssm_norm",
                  "mixer.q_proj": "attn_q", "mixer.k_proj": "attn_k", "mixer.v_proj": "attn_v",
                  "mixer.o_proj": "attn_output", "mixer.up_proj": "ffn_up",
                  "mixer.down_proj": "ffn_down", "mixer.gate": "ffn_gate_inp",
                  "mixer.shared_experts.up_proj": "ffn_up_shexp",
                  "mixer.shared_experts.down_proj": "ffn_down_shexp"}
NEMOTRON_GLOBALS = {"backbone.embeddings.weight": "token_embd.weight",
                    "backbone.norm_f.weight": "output_norm.weight",
                    "lm_head.weight": "output.weight"}


def convert_nemotron_h(folder: str, path: str, quantized: bool, **options) -> str:
    """Nemotron-H with experts as `nemotron_h_moe`: A_log as -exp(A_log) [H, 1], D as [H, 1],
    the gated norm as [groups, I / groups], q/k permuted as for a llama rope."""
    import torch

    config, state = read_folder(folder)
    kinds = [{"linear_attention": "mamba", "full_attention": "attention"}.get(kind, kind)
             for kind in config["layers_block_type"]]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["head_dim"]
    groups = config["n_groups"]
    tensors = {}
    for name, value in state.items():
        if name in NEMOTRON_GLOBALS:
            tensors[NEMOTRON_GLOBALS[name]] = value
            continue
        layer = name.split(".")[2]
        if name.endswith("mixer.A_log"):
            tensors[f"blk.{layer}.ssm_a"] = -torch.exp(torch.from_numpy(value)).numpy()[:, None]
        elif name.endswith("mixer.D"):
            tensors[f"blk.{layer}.ssm_d"] = value[:, None]
        elif name.endswith("mixer.dt_bias"):
            tensors[f"blk.{layer}.ssm_dt.bias"] = value
        elif name.endswith("e_score_correction_bias"):
            tensors[f"blk.{layer}.exp_probs_b.bias"] = value
        else:
            if name.endswith("conv1d.weight"):
                value = value.squeeze(1)
            elif name.endswith("mixer.norm.weight"):
                value = value.reshape(groups, -1)
            elif name.endswith("q_proj.weight"):
                value = permute_for_rope(value, heads)
            elif name.endswith("k_proj.weight"):
                value = permute_for_rope(value, kv_heads)
            tensors[name] = value
    tensors = stack_experts(tensors, lambda n: n if n.startswith(("blk.", "token_embd", "output"))
                            else layer_rename(n, NEMOTRON_PARTS))

    def metadata(writer) -> None:
        writer.add_block_count(len(kinds))
        writer.add_context_length(2 ** 20)  # no rope
        writer.add_embedding_length(config["hidden_size"])
        writer.add_head_count(heads)
        writer.add_head_count_kv([kv_heads if kind == "attention" else 0 for kind in kinds])
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
        writer.add_layer_norm_eps(config["layer_norm_epsilon"])
        writer.add_feed_forward_length([config["moe_intermediate_size"] if kind == "moe" else 0
                                        for kind in kinds])
        writer.add_ssm_conv_kernel(config["conv_kernel"])
        writer.add_ssm_state_size(config["ssm_state_size"])
        writer.add_ssm_group_count(groups)
        writer.add_ssm_inner_size(config["mamba_num_heads"] * config["mamba_head_dim"])
        writer.add_ssm_time_step_rank(config["mamba_num_heads"])
        writer.add_expert_count(config["n_routed_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(
            config["moe_shared_expert_intermediate_size"])
        writer.add_expert_weights_norm(config["norm_topk_prob"])
        writer.add_expert_weights_scale(config["routed_scaling_factor"])
        writer.add_expert_group_count(config["n_group"])
        writer.add_expert_group_used_count(config["topk_group"])
        writer.add_eos_token_id(2)

    return write_file(path, "nemotron_h_moe", metadata, tensors, quantized, **options)


CONVERTERS = {"qwen3_moe": convert_moe, "mixtral": convert_moe,
              "qwen3_next": convert_qwen_hybrid, "qwen3_5": convert_qwen_hybrid,
              "qwen3_5_moe": convert_qwen_hybrid, "nemotron_h": convert_nemotron_h}


def q8_0_reference(folder: str, destination: str) -> str:
    """A copy of the checkpoint holding the values its Q8_0 file stores, in Hugging Face's
    layout: every change of layout the converters make moves whole rows, which commutes with
    quantizing rows, except Qwen3.5's tiled out_proj columns, quantized here as the file has
    them."""
    from safetensors.numpy import save_file

    config, state = read_folder(folder)
    with open(os.path.join(destination, "config.json"), "w") as handle:
        json.dump(config, handle)
    routers = ("mlp.gate.weight", "block_sparse_moe.gate.weight", "mixer.gate.weight")
    tiled = config["model_type"].startswith("qwen3_5") and \
        config["linear_num_key_heads"] != config["linear_num_value_heads"]
    for name, values in state.items():
        part = "ffn_gate_inp" if name.endswith(routers) else "ssm_conv1d" \
            if "conv1d" in name else "norm" if "norm" in name else name
        kind = q8_0_file_type(part, values)
        if tiled and name.endswith("linear_attn.out_proj.weight"):
            args = (config["linear_num_key_heads"], config["linear_num_value_heads"],
                    config["linear_value_head_dim"])
            order = tiled_value_heads(np.arange(values.shape[1])[None], *args, axis=1)[0]
            state[name] = np.ascontiguousarray(
                stored_values(values[:, order], kind)[:, np.argsort(order)])
        else:
            state[name] = stored_values(values, kind)
    save_file(state, os.path.join(destination, "model.safetensors"))
    return destination


# -- the tests --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_files(hybrid_checkpoints, tmp_path_factory):
    """(variant, quantized) -> a GGUF file of that tiny checkpoint, written on first use."""
    folder = tmp_path_factory.mktemp("gguf-families")
    written: dict[tuple[str, bool], str] = {}

    def get(variant: str, quantized: bool = False) -> str:
        if (variant, quantized) not in written:
            path = str(folder / f"{variant}-{'q8_0' if quantized else 'f32'}.gguf")
            written[variant, quantized] = CONVERTERS[variant](hybrid_checkpoints[variant], path,
                                                              quantized)
        return written[variant, quantized]

    return get


def folder_target(folder: str):
    from exactdraft.pretrained import build_target, load_checkpoint

    return build_target(load_checkpoint(folder), "torch")


def build(path: str, **options):
    from exactdraft.pretrained import build_target, load_checkpoint

    checkpoint = load_checkpoint(path, **options)
    return checkpoint, build_target(checkpoint, "torch")


@pytest.mark.parametrize("variant", list(CONVERTERS))
def test_f32_file_gives_the_folders_logits_bit_for_bit(variant, gguf_files, hybrid_checkpoints):
    checkpoint, ours = build(gguf_files(variant))
    folder = folder_target(hybrid_checkpoints[variant])
    assert ours.trunk.model_type == folder.trunk.model_type
    for theirs, mine in zip(folder.recurrent, ours.recurrent, strict=True):
        # The one value the file holds rounded: A = -exp(A_log) in float32.
        name = "decay_rate" if hasattr(mine, "decay_rate") else "a"
        assert np.allclose(getattr(theirs, name), getattr(mine, name), rtol=1e-6, atol=0)
        setattr(theirs, name, getattr(mine, name))
    assert set(checkpoint.metadata["tensor_types"]) == {"F32"}
    tokens = probe_tokens(TOKENS, ours.vocab_size, salt=5)
    got = ours.forward(ours.new_state(), tokens, rows="all")
    want = folder.forward(folder.new_state(), tokens, rows="all")
    assert got.dtype == want.dtype == np.float32 and got.tobytes() == want.tobytes()
    assert ours.eos_token_ids == (2,)


@pytest.mark.parametrize("variant", list(CONVERTERS))
def test_q8_0_file_is_close_to_transformers(variant, gguf_files, hybrid_checkpoints, tmp_path):
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.pretrained import build_target, load_checkpoint

    path = gguf_files(variant, quantized=True)
    checkpoint = load_checkpoint(path)
    kinds = checkpoint.metadata["tensor_types"]
    assert kinds.get("Q8_0", 0) > 0 and kinds.get("F32", 0) > 0
    kept = [name for name, value in checkpoint.tensors.items()
            if isinstance(value, QuantizedTensor)]
    assert kept and (variant == "qwen3_5" or any(".experts." in name for name in kept))
    reference = q8_0_reference(hybrid_checkpoints[variant], str(tmp_path))
    tokens = probe_tokens(TOKENS, checkpoint.config.vocab_size, salt=5)
    # Kept blocks, float activations (the default int8 activations are llama.cpp's, not
    # transformers').
    ours = build_target(checkpoint, TorchCPUBackend(quantized_activations=False))
    got = ours.forward(ours.new_state(), tokens, rows="all")
    error = relative_error(got, hf_logits(reference, tuple(tokens)))
    print(f"{variant}: Q8_0 file vs transformers on its values, max |diff| / max |logit| = "
          f"{error:.2e}")
    assert error < Q8_TOLERANCE
    # Dequantized at load, the file gives the reference folder's logits bit for bit.
    _, dense = build(path, keep_quantized=False)
    folder = folder_target(reference)
    for theirs, mine in zip(folder.recurrent, dense.recurrent, strict=True):
        name = "decay_rate" if hasattr(mine, "decay_rate") else "a"
        setattr(theirs, name, getattr(mine, name))  # as in the F32 test
    assert dense.forward(dense.new_state(), tokens, rows="all").tobytes() == \
        folder.forward(folder.new_state(), tokens, rows="all").tobytes()


@pytest.mark.parametrize("variant, field", [
    ("qwen3_moe", "qwen3moe.expert_count"), ("mixtral", "llama.expert_used_count"),
    ("qwen3_next", "qwen3next.ssm.inner_size"), ("qwen3_5", "qwen35.ssm.conv_kernel"),
    ("qwen3_5_moe", "qwen35moe.expert_feed_forward_length"),
    ("nemotron_h", "nemotron_h_moe.ssm.time_step_rank")])
def test_a_missing_field_is_named(variant, field, hybrid_checkpoints, tmp_path):
    from exactdraft.pretrained import load_checkpoint

    path = CONVERTERS[variant](hybrid_checkpoints[variant], str(tmp_path / "cut.gguf"), False,
                               drop=(field,))
    with pytest.raises(ConfigError, match=re.escape(path) + r".*" + re.escape(repr(field))):
        load_checkpoint(path)


@pytest.mark.parametrize("variant, tensor, name", [
    ("qwen3_moe", "blk.0.ffn_up_exps.weight", "model.layers.0.mlp.experts.0.up_proj.weight"),
    ("qwen3_5", "blk.0.ssm_a", "model.layers.0.linear_attn.A_log"),
    ("nemotron_h", "blk.0.ssm_d", "backbone.layers.0.mixer.D")])
def test_a_missing_tensor_is_named(variant, tensor, name, hybrid_checkpoints, tmp_path):
    path = CONVERTERS[variant](hybrid_checkpoints[variant], str(tmp_path / "cut.gguf"), False,
                               drop=(tensor,))
    with pytest.raises(WeightError, match=re.escape(path) + r".*missing tensor " +
                       re.escape(repr(name))):
        build(path)


def test_a_tensor_the_family_does_not_have_is_named(hybrid_checkpoints, tmp_path):
    extra = {"blk.0.ffn_gate_up_exps.weight": np.zeros((4, 64, 64), np.float32)}
    path = convert_moe(hybrid_checkpoints["qwen3_moe"], str(tmp_path / "extra.gguf"), False,
                       extra=extra)
    with pytest.raises(WeightError, match=re.escape(path) + r".*'blk.0.ffn_gate_up_exps.weight'"):
        build(path)


def test_qwen3_5_mtp_blocks_load_as_the_mtp_head(hybrid_checkpoints, tmp_path):
    from tests.hybrid_checkpoints import mtp_copy

    folder = mtp_copy(hybrid_checkpoints["qwen3_5"], str(tmp_path / "mtp"))
    checkpoint, ours = build(convert_qwen_hybrid(folder, str(tmp_path / "mtp.gguf"), False))
    assert checkpoint.config.num_layers == 2 and checkpoint.config.mtp_layers == 1
    theirs = folder_target(folder)
    for mine, other in zip(ours.recurrent, theirs.recurrent, strict=True):
        other.decay_rate = mine.decay_rate  # as in the F32 test
    tokens = probe_tokens(12, ours.vocab_size, salt=7)
    assert ours.forward(ours.new_state(), tokens, rows="all").tobytes() == \
        theirs.forward(theirs.new_state(), tokens, rows="all").tobytes()
    hidden = np.random.default_rng(0).standard_normal((len(tokens), 64)).astype(np.float32)
    got = ours.mtp.forward(ours.mtp.new_state(), tokens, hidden)
    want = theirs.mtp.forward(theirs.mtp.new_state(), tokens, hidden)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))
