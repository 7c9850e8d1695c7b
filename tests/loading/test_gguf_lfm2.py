"""LFM2 GGUF files, written from the tiny transformers checkpoint as llama.cpp's converter writes
them (architecture `lfm2`: attention.head_count_kv 0 for the convolution layers, the final norm
as token_embd_norm, each convolution's kernel squeezed to [H, K] and kept F32, q/k rows as
stored), then loaded with exactdraft.

An F32 file gives logits bitwise equal to the Hugging Face folder on the same backend; a Q8_0
file stays within Q8_0's error of transformers run on the values the file stores, and
dequantized at load gives those values' logits bit for bit; a missing field or tensor is
refused with the file and the field named."""

from __future__ import annotations

import json
import os
import re

import pytest

from exactdraft.errors import ConfigError, WeightError
from exactdraft.formats import QuantizedTensor
from exactdraft.guard import probe_tokens
from tests.loading.test_gguf_families import (
    Q8_TOLERANCE,
    TOKENS,
    build,
    folder_target,
    layer_rename,
    q8_0_file_type,
    read_folder,
    rope_theta,
    stored_values,
    write_file,
)
from tests.models.test_moe import hf_logits, relative_error

gguf = pytest.importorskip("gguf")

LFM2_PARTS = {
    "operator_norm": "attn_norm", "ffn_norm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.out_proj": "attn_output", "self_attn.q_layernorm": "attn_q_norm",
    "self_attn.k_layernorm": "attn_k_norm", "conv.conv": "shortconv.conv",
    "conv.in_proj": "shortconv.in_proj", "conv.out_proj": "shortconv.out_proj",
    "feed_forward.w1": "ffn_gate", "feed_forward.w3": "ffn_up", "feed_forward.w2": "ffn_down",
}
FINAL_NORM = {"model.embedding_norm.weight": "token_embd_norm.weight"}


def gguf_name(name: str) -> str:
    return FINAL_NORM.get(name) or layer_rename(name, LFM2_PARTS)


def file_type(name: str, values) -> str:
    """The converter's type for output type Q8_0 of the tensor with this GGUF name."""
    return q8_0_file_type(re.sub(r"\.(weight|bias)$", "", name).split(".")[-1], values)


def converted(state: dict) -> dict:
    """The tensors under llama.cpp's names and layouts."""
    return {gguf_name(name): value.squeeze(1) if name.endswith("conv.conv.weight") else value
            for name, value in state.items()}


def convert_lfm2(folder: str, path: str, quantized: bool, **options) -> str:
    config, state = read_folder(folder)
    kinds = config["layer_types"]

    def metadata(writer) -> None:
        writer.add_block_count(len(kinds))
        writer.add_context_length(config["max_position_embeddings"])
        writer.add_embedding_length(config["hidden_size"])
        writer.add_feed_forward_length(state["model.layers.0.feed_forward.w1.weight"].shape[0])
        writer.add_head_count(config["num_attention_heads"])
        writer.add_head_count_kv([config["num_key_value_heads"] if kind == "full_attention"
                                  else 0 for kind in kinds])
        writer.add_rope_freq_base(rope_theta(config))
        writer.add_layer_norm_rms_eps(config["norm_eps"])
        writer.add_vocab_size(config["vocab_size"])
        writer.add_shortconv_l_cache(config["conv_L_cache"])
        writer.add_eos_token_id(2)

    return write_file(path, "lfm2", metadata, converted(state), quantized, **options)


def q8_0_reference(folder: str, destination: str) -> str:
    """A copy of the checkpoint holding the values its Q8_0 file stores (the converter changes
    no row's layout but the kernel's, which it keeps F32)."""
    from safetensors.numpy import save_file

    config, state = read_folder(folder)
    with open(os.path.join(destination, "config.json"), "w") as handle:
        json.dump(config, handle)
    save_file({name: stored_values(value, file_type(gguf_name(name), value))
               for name, value in state.items()},
              os.path.join(destination, "model.safetensors"))
    return destination


def test_f32_file_gives_the_folders_logits_bit_for_bit(hybrid_checkpoints, tmp_path):
    folder = hybrid_checkpoints["lfm2"]
    checkpoint, ours = build(convert_lfm2(folder, str(tmp_path / "lfm2.gguf"), False))
    theirs = folder_target(folder)
    fields = ("attention_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
              "conv_kernel", "conv_bias", "tie_word_embeddings", "rope_theta")
    assert [getattr(checkpoint.config, f) for f in fields] == \
        [getattr(theirs.config, f) for f in fields]
    assert set(checkpoint.metadata["tensor_types"]) == {"F32"}
    tokens = probe_tokens(TOKENS, ours.vocab_size, salt=5)
    got = ours.forward(ours.new_state(), tokens, rows="all")
    assert got.tobytes() == theirs.forward(theirs.new_state(), tokens, rows="all").tobytes()
    assert ours.eos_token_ids == (2,)


def test_q8_0_file_is_close_to_transformers(hybrid_checkpoints, tmp_path):
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.pretrained import build_target, load_checkpoint

    folder = hybrid_checkpoints["lfm2"]
    path = convert_lfm2(folder, str(tmp_path / "lfm2-q8_0.gguf"), True)
    checkpoint = load_checkpoint(path)
    kept = [name for name, value in checkpoint.tensors.items()
            if isinstance(value, QuantizedTensor)]
    assert "model.layers.0.feed_forward.w2.weight" in kept  # rows of 64: whole Q8_0 blocks
    assert not any(".conv.conv." in name for name in kept)  # the kernel stays F32
    reference = q8_0_reference(folder, str(tmp_path))
    tokens = probe_tokens(TOKENS, checkpoint.config.vocab_size, salt=5)
    ours = build_target(checkpoint, TorchCPUBackend(quantized_activations=False))
    got = ours.forward(ours.new_state(), tokens, rows="all")
    assert relative_error(got, hf_logits(reference, tuple(tokens))) < Q8_TOLERANCE
    _, dense = build(path, keep_quantized=False)
    want = folder_target(reference)
    assert dense.forward(dense.new_state(), tokens, rows="all").tobytes() == \
        want.forward(want.new_state(), tokens, rows="all").tobytes()


@pytest.mark.parametrize("drop, error, named", [
    ("lfm2.shortconv.l_cache", ConfigError, "'lfm2.shortconv.l_cache'"),
    ("blk.0.shortconv.conv.weight", WeightError,
     "missing tensor 'model.layers.0.conv.conv.weight'"),
    ("blk.1.attn_k_norm.weight", WeightError,
     "missing tensor 'model.layers.1.self_attn.k_norm.weight'")])
def test_a_missing_field_or_tensor_is_named(drop, error, named, hybrid_checkpoints, tmp_path):
    path = convert_lfm2(hybrid_checkpoints["lfm2"], str(tmp_path / "cut.gguf"), False,
                        drop=(drop,))
    with pytest.raises(error, match=re.escape(path) + r".*" + re.escape(named)):
        build(path)


def test_the_lfm2_pre_tokenizer_is_llama_3s():
    """llama.cpp reads tokenizer.ggml.pre "lfm2" as llama-3's split, whole words kept."""
    from exactdraft.loading.tokenizer import Tokenizer
    from tests.loading.test_tokenizer import synthetic_gguf

    merges = ["a b", "Ġ a"]
    lfm2, llama3 = (Tokenizer.from_gguf(synthetic_gguf(pre, merges))
                    for pre in ("lfm2", "llama-bpe"))
    text = "I'm 12345 DON'T  x abc a"
    assert lfm2.backend.pre_tokenizer.pre_tokenize_str(text) == \
        llama3.backend.pre_tokenizer.pre_tokenize_str(text)
    piece = lfm2.backend.token_to_id
    assert lfm2.encode("abc a") == llama3.encode("abc a") == [piece("abc"), piece("Ġa")]
