"""GGUF files of GLM-4.5 (llama.cpp's `glm4moe`), written from the tiny transformers checkpoint
with an MTP layer as llama.cpp's converter writes them (experts stacked [E, rows, K], the
correction bias as exp_probs_b, the MTP layer's parts as blk.L.nextn.*, block_count counting
it), then loaded with exactdraft: the F32 file gives the folder's logits and MTP logits bit for
bit, and a missing field is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.errors import ConfigError
from exactdraft.guard import probe_tokens
from tests.drafters.test_nextn_mtp import nextn_copy
from tests.models.families.test_deepseek_v3 import build_checkpoint, load
from tests.models.families.test_glm4_moe import GLM4_MOE

gguf = pytest.importorskip("gguf")

from tests.loading.test_gguf_families import (  # noqa: E402  (needs gguf)
    LAYER_PARTS,
    common_metadata,
    layer_rename,
    read_folder,
    stack_experts,
    write_file,
)

GLM_PARTS = {
    **LAYER_PARTS, "post_attention_layernorm": "post_attention_norm",
    **{f"mlp.shared_experts.{kind}_proj": f"ffn_{kind}_shexp" for kind in ("gate", "up", "down")},
    **{hf: f"nextn.{part}" for hf, part in (
        ("eh_proj", "eh_proj"), ("enorm", "enorm"), ("hnorm", "hnorm"),
        ("shared_head.norm", "shared_head_norm"), ("shared_head.head", "shared_head_head"))},
}


def glm_rename(name: str) -> str:
    if name.endswith("mlp.gate.e_score_correction_bias"):
        return f"blk.{name.split('.')[2]}.exp_probs_b.bias"
    return layer_rename(name, GLM_PARTS)


def routed_metadata(writer, config: dict, gating: int = 2) -> None:
    """The expert_* fields both families' converters write (gating 2: sigmoid)."""
    writer.add_leading_dense_block_count(config["first_k_dense_replace"])
    writer.add_expert_count(config["n_routed_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    writer.add_expert_weights_norm(config["norm_topk_prob"])
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType(gating))
    writer.add_expert_group_count(config["n_group"])
    writer.add_expert_group_used_count(config["topk_group"])


def convert_glm4_moe(folder: str, path: str, drop: tuple[str, ...] = ()) -> str:
    config, state = read_folder(folder)
    head_dim = config["head_dim"]

    def metadata(writer) -> None:
        common_metadata(writer, config, head_dim, extra_blocks=1)
        writer.add_nextn_predict_layers(1)
        writer.add_rope_dimension_count(int(head_dim * config["rope_parameters"]
                                            ["partial_rotary_factor"]))
        writer.add_feed_forward_length(config["intermediate_size"])
        routed_metadata(writer, config)

    return write_file(path, "glm4moe", metadata, stack_experts(state, glm_rename), False,
                      drop=drop)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    plain = build_checkpoint(str(tmp_path_factory.mktemp("glm4_moe")), GLM4_MOE)
    return nextn_copy(plain, str(tmp_path_factory.mktemp("glm4_moe-mtp")))


def test_f32_file_gives_the_folders_logits_bit_for_bit(folder, tmp_path):
    ours = load(convert_glm4_moe(folder, str(tmp_path / "glm.gguf")))
    theirs = load(folder)
    assert ours.trunk.model_type == "glm4_moe" and len(ours.layers) == 3
    assert ours.config.routing == theirs.config.routing
    tokens = probe_tokens(40, ours.vocab_size, salt=5)
    for target in (ours, theirs):
        target.keep_hidden = True
    states = [ours.new_state(), theirs.new_state()]
    got, want = (t.forward(s, tokens, rows="all") for t, s in zip((ours, theirs), states))
    assert got.tobytes() == want.tobytes()
    hidden = states[1].take_hidden(0, len(tokens))
    heads = [t.mtp.forward(t.mtp.new_state(), tokens[1:], hidden[:-1])[0]
             for t in (ours, theirs)]
    assert heads[0].tobytes() == heads[1].tobytes() and np.abs(heads[1]).max() > 1.0


def test_a_missing_field_is_named(folder, tmp_path):
    path = convert_glm4_moe(folder, str(tmp_path / "glm.gguf"), drop=("glm4moe.expert_count",))
    with pytest.raises(ConfigError, match="glm4moe.expert_count"):
        load(path)
