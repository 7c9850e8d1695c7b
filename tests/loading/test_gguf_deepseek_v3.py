"""GGUF files of DeepSeek-V3 (llama.cpp's `deepseek2`), written from a tiny transformers
checkpoint as llama.cpp's converter writes them (one key head of kv_lora_rank + rope, the
per-head sizes as key_length_mla / value_length_mla, kv_b_proj split into attn_k_b, transposed
per head, and attn_v_b, experts stacked, the correction bias as exp_probs_b, yarn as
rope.scaling.* with yarn_log_multiplier = 0.1 mscale_all_dim), then loaded with exactdraft:
the file gives transformers' logits, and a softmax-routed (DeepSeek-V2) file is refused."""

from __future__ import annotations

import re

import numpy as np
import pytest

from exactdraft.errors import ConfigError
from exactdraft.guard import probe_tokens
from tests.loading.test_gguf_glm4_moe import routed_metadata
from tests.models.families.test_deepseek_v3 import DEEPSEEK_V3, build_checkpoint, load
from tests.models.test_moe import hf_logits, relative_error

gguf = pytest.importorskip("gguf")

from tests.loading.test_gguf_families import (  # noqa: E402  (needs gguf)
    GLOBALS,
    read_folder,
    stack_experts,
    write_file,
)

# As DeepSeek-V3 ships it: one mscale for the rope and the scores.
SETTINGS = {**DEEPSEEK_V3, "rope_parameters": {**DEEPSEEK_V3["rope_parameters"],
                                               "mscale": 1.0, "mscale_all_dim": 1.0}}
PARTS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
         "self_attn.q_a_proj": "attn_q_a", "self_attn.q_a_layernorm": "attn_q_a_norm",
         "self_attn.q_b_proj": "attn_q_b", "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
         "self_attn.kv_a_layernorm": "attn_kv_a_norm", "self_attn.o_proj": "attn_output",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         "mlp.gate": "ffn_gate_inp", "mlp.gate.e_score_correction": "exp_probs_b",
         **{f"mlp.shared_experts.{k}_proj": f"ffn_{k}_shexp" for k in ("gate", "up", "down")}}


def rename(name: str) -> str:
    if name in GLOBALS or name.startswith("blk."):
        return GLOBALS.get(name, name)
    layer, part, kind = re.fullmatch(r"model\.layers\.(\d+)\.(.+)[._](weight|bias)",
                                     name).groups()
    return f"blk.{layer}.{PARTS[part]}.{kind}"


def convert_deepseek(folder: str, path: str, gating: int = 2) -> str:
    config, state = read_folder(folder)
    heads, nope = config["num_attention_heads"], config["qk_nope_head_dim"]
    rank, rope, value = config["kv_lora_rank"], config["qk_rope_head_dim"], config["v_head_dim"]
    for name in [n for n in state if n.endswith("kv_b_proj.weight")]:
        both = state.pop(name).reshape(heads, nope + value, rank)
        layer = name.split(".")[2]
        state[f"blk.{layer}.attn_k_b.weight"] = both[:, :nope].transpose(0, 2, 1).copy()
        state[f"blk.{layer}.attn_v_b.weight"] = both[:, nope:].copy()
    yarn = config["rope_parameters"]

    def metadata(writer) -> None:
        writer.add_block_count(config["num_hidden_layers"])
        writer.add_context_length(config["max_position_embeddings"])
        writer.add_embedding_length(config["hidden_size"])
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_head_count(heads)
        writer.add_head_count_kv(1)
        writer.add_rope_freq_base(yarn["rope_theta"])
        writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
        writer.add_q_lora_rank(config["q_lora_rank"])
        writer.add_kv_lora_rank(rank)
        writer.add_key_length(rank + rope)
        writer.add_value_length(rank)
        writer.add_key_length_mla(nope + rope)
        writer.add_value_length_mla(value)
        routed_metadata(writer, config, gating)
        writer.add_rope_dimension_count(rope)
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(yarn["factor"])
        writer.add_rope_scaling_orig_ctx_len(yarn["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_log_mul(0.1 * yarn["mscale_all_dim"])
        writer.add_eos_token_id(2)

    return write_file(path, "deepseek2", metadata, stack_experts(state, rename), False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    return build_checkpoint(str(tmp_path_factory.mktemp("deepseek_v3-gguf")), SETTINGS)


def test_the_file_gives_transformers_logits(folder, tmp_path):
    ours = load(convert_deepseek(folder, str(tmp_path / "v3.gguf")))
    theirs = load(folder)
    assert ours.trunk.model_type == "deepseek_v3" and ours.mtp is None
    assert (ours.config.qk_nope_head_dim, ours.config.v_head_dim) == (12, 10)
    assert ours.config.routing == theirs.config.routing
    tokens = probe_tokens(50, ours.vocab_size, salt=5)
    got = ours.forward(ours.new_state(), tokens, rows="all")
    assert relative_error(got, hf_logits(folder, tuple(tokens))) < 2e-5
    # The folder's own model: the same but for the score scale, which the file holds as
    # 0.1 * mscale_all_dim in float32.
    want = theirs.forward(theirs.new_state(), tokens, rows="all")
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_a_softmax_routed_file_is_refused(folder, tmp_path):
    with pytest.raises(ConfigError, match="deepseek2.expert_gating_func"):
        load(convert_deepseek(folder, str(tmp_path / "v2.gguf"), gating=1))
