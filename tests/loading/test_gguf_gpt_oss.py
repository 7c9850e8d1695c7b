"""gpt-oss GGUF files written from the tiny checkpoint as llama.cpp's converter writes them
(architecture `gpt-oss`, `attn_sinks`, `post_attention_norm`, the router's bias, experts
stacked [E, rows, K] with gate and up apart and their biases; experts in F32 or MXFP4): an F32
file gives the folder's logits bit for bit where both use llama.cpp's settings (YaRN's ramp
bounds rounded outwards, the SwiGLU limit 7), an MXFP4 file the logits of its dequantized
experts bit for bit, and a file without the sinks is refused naming them."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from exactdraft.errors import WeightError
from exactdraft.guard import probe_tokens
from tests.loading.test_gguf_families import common_metadata, read_folder
from tests.models.families.test_gpt_oss import SETTINGS

gguf = pytest.importorskip("gguf")

PARTS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
         "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "post_attention_layernorm": "post_attention_norm",
         "mlp.router": "ffn_gate_inp"}
GLOBALS = {"model.embed_tokens.weight": "token_embd.weight",
           "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_tensors(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The converter's names and layouts: experts [E, rows, K] with gate and up apart."""
    out = {}
    for name, value in state.items():
        if name in GLOBALS:
            out[GLOBALS[name]] = value
            continue
        layer, rest = name.split(".layers.")[1].split(".", 1)
        block = f"blk.{layer}."
        if rest == "self_attn.sinks":
            out[block + "attn_sinks.weight"] = value
        elif rest == "mlp.experts.gate_up_proj":  # [E, H, 2I], gate and up interleaved
            out[block + "ffn_gate_exps.weight"] = np.swapaxes(value[..., 0::2], 1, 2)
            out[block + "ffn_up_exps.weight"] = np.swapaxes(value[..., 1::2], 1, 2)
        elif rest == "mlp.experts.gate_up_proj_bias":
            out[block + "ffn_gate_exps.bias"] = value[:, 0::2]
            out[block + "ffn_up_exps.bias"] = value[:, 1::2]
        elif rest == "mlp.experts.down_proj":  # [E, I, H]
            out[block + "ffn_down_exps.weight"] = np.swapaxes(value, 1, 2)
        elif rest == "mlp.experts.down_proj_bias":
            out[block + "ffn_down_exps.bias"] = value
        else:
            part, kind = rest.rsplit(".", 1)
            out[f"{block}{PARTS[part]}.{kind}"] = value
    return {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in out.items()}


def write_gguf(folder: str, path: str, mxfp4: bool = False, drop: str = "") -> str:
    config, state = read_folder(folder)
    rope = config["rope_parameters"]
    writer = gguf.GGUFWriter(path, "gpt-oss")
    common_metadata(writer, config, config["head_dim"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_expert_count(config["num_local_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_feed_forward_length(config["intermediate_size"])
    writer.add_sliding_window(config["sliding_window"])
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(rope["factor"])
    writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    for name, values in gguf_tensors(state).items():
        if drop and drop in name:
            continue
        if mxfp4 and name.endswith("_exps.weight"):
            qtype = gguf.GGMLQuantizationType.MXFP4
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    """The tiny checkpoint with llama.cpp's settings: YaRN's ramp bounds rounded outwards, the
    SwiGLU limit 7."""
    from tests.conftest import build_tiny_checkpoint

    settings = dict(SETTINGS, swiglu_limit=7.0,
                    rope_parameters={**SETTINGS["rope_parameters"], "truncate": True})
    return build_tiny_checkpoint(str(tmp_path_factory.mktemp("gpt_oss")), "llama", **settings)


def logits(path: str, dequantized: bool = False) -> np.ndarray:
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.pretrained import build_target, load_checkpoint

    # float32 activations: mxfp4 has no float kernel, so the blocks' exact values multiply
    backend = TorchCPUBackend(quantized_activations=not dequantized)
    target = build_target(load_checkpoint(path), backend)
    tokens = probe_tokens(40, target.vocab_size, salt=7)
    return target.forward(target.new_state(), tokens, rows="all")


def test_an_f32_file_gives_the_folders_logits_bit_for_bit(folder, tmp_path):
    from exactdraft.pretrained import load_checkpoint

    path = write_gguf(folder, str(tmp_path / "f32.gguf"))
    config = load_checkpoint(path).config
    assert (config.model_type, config.sliding_windows, config.yarn.truncate) == (
        "gpt_oss", (12, 0), True)
    assert logits(path).tobytes() == logits(folder).tobytes()


def test_an_mxfp4_file_gives_the_logits_of_its_dequantized_experts(folder, tmp_path):
    """The MXFP4 stacks stay in their blocks (one expert sliced at a time) and hold their exact
    values: dequantized, they give the bits of the folder whose experts hold those values, and
    kept in their blocks they run within the int8 activations' error of it."""
    from exactdraft.pretrained import load_checkpoint
    from tests.hybrid_checkpoints import edit_tensors

    path = write_gguf(folder, str(tmp_path / "mxfp4.gguf"), mxfp4=True)
    checkpoint = load_checkpoint(path)
    stored = checkpoint.tensors["model.layers.0.mlp.experts.1.gate_proj.weight"]
    assert type(stored).__name__ == "QuantizedTensor" and stored.format == "mxfp4"
    copy = str(shutil.copytree(folder, tmp_path / "dequantized"))
    qtype = gguf.GGMLQuantizationType.MXFP4

    def as_stored(tensors: dict) -> None:
        for name in [n for n in tensors if n.endswith(("gate_up_proj", "down_proj"))]:
            rows = np.swapaxes(tensors[name], 1, 2)  # [E, N, K]
            values = gguf.quants.dequantize(gguf.quants.quantize(
                np.ascontiguousarray(rows), qtype), qtype)
            tensors[name] = np.ascontiguousarray(np.swapaxes(values, 1, 2))

    edit_tensors(copy, as_stored)
    reference = logits(copy)
    assert logits(path, dequantized=True).tobytes() == reference.tobytes()
    assert logits(path, dequantized=True).tobytes() != logits(folder).tobytes()  # they rounded
    # Kept in their blocks, the experts run on the integer-dot kernels (int8 activations).
    scale = np.abs(reference).max()
    assert np.abs(logits(path) - reference).max() / scale < 3e-2


def test_a_file_without_the_sinks_is_refused_naming_them(folder, tmp_path):
    path = write_gguf(folder, str(tmp_path / "no_sinks.gguf"), drop="attn_sinks")
    with pytest.raises(WeightError, match="self_attn.sinks"):
        logits(path)

