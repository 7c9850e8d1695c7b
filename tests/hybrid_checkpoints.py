"""Tiny random checkpoints of the mixture-of-experts and hybrid families, built with transformers
and saved as safetensors (through tests/conftest.py's build_tiny_checkpoint), the edits the
tests make to them (a nested, text_config Qwen3.5 copy with vision tensors; fused-expert copies;
`mtp.*` tensors under the names and shapes real checkpoints use), and the session fixtures
hybrid_checkpoints and hybrid_targets (imported by tests/conftest.py)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=16, linear_conv_kernel_dim=4)
EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
HYBRID_VARIANTS = {
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=16, norm_topk_prob=True,
                      mlp_only_layers=[1], **EXPERTS),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2,
                    intermediate_size=48, sliding_window=24),
    "qwen3_next": dict(model_type="qwen3_next", head_dim=16, num_hidden_layers=3,
                       layer_types=["linear_attention", "full_attention", "linear_attention"],
                       shared_expert_intermediate_size=48, mlp_only_layers=[2],
                       **EXPERTS, **LINEAR),
    "qwen3_5": dict(model_type="qwen3_5_text", head_dim=16,
                    layer_types=["linear_attention", "full_attention"], **LINEAR),
    "qwen3_5_moe": dict(model_type="qwen3_5_moe_text", head_dim=16,
                        layer_types=["linear_attention", "full_attention"],
                        shared_expert_intermediate_size=48, **EXPERTS, **LINEAR),
    "nemotron_h": dict(model_type="nemotron_h", hybrid_override_pattern="M*EM-",
                       mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=2,
                       head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, moe_shared_expert_intermediate_size=48,
                       n_group=2, topk_group=1, routed_scaling_factor=1.5),
    "lfm2": dict(model_type="lfm2", hidden_size=48, num_attention_heads=3,
                 num_key_value_heads=1, num_hidden_layers=3,
                 layer_types=["conv", "full_attention", "conv"], block_multiple_of=16),
}
MOE_FAMILIES = ("qwen3_moe", "mixtral")
RECURRENT_FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h", "lfm2")


def build_hybrid_checkpoint(folder: str, variant: str, seed: int = 0) -> str:
    from tests.conftest import build_tiny_checkpoint

    settings = dict(HYBRID_VARIANTS[variant])
    build_tiny_checkpoint(folder, "llama", seed=seed, **settings)
    if variant == "nemotron_h":  # a buffer transformers leaves at zero: give it values
        edit_tensors(folder, lambda t: t.update({
            name: np.linspace(-0.2, 0.2, 4, dtype=np.float32)[::-1].copy()
            for name in t if name.endswith("e_score_correction_bias")}))
    return folder


def edit_tensors(folder: str, edit) -> None:
    from safetensors.numpy import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def nested_qwen3_5_copy(folder: str, destination: str) -> str:
    """The flat qwen3_5_text checkpoint as Qwen3.5 ships it: text under text_config and
    model.language_model., a vision tower beside it (model.visual.*, ignored)."""
    shutil.copytree(folder, destination, dirs_exist_ok=True)
    with open(os.path.join(folder, "config.json")) as handle:
        text = json.load(handle)
    config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
              "text_config": text, "vision_config": {"model_type": "qwen3_5", "depth": 1},
              "tie_word_embeddings": False}
    with open(os.path.join(destination, "config.json"), "w") as handle:
        json.dump(config, handle)

    def nest(tensors: dict) -> None:
        for name in [n for n in tensors if n.startswith("model.")]:
            tensors["model.language_model." + name[len("model."):]] = tensors.pop(name)
        tensors["model.visual.patch_embed.proj.weight"] = np.ones((8, 3, 2, 4, 4), np.float32)
        tensors["model.visual.merger.linear_fc1.weight"] = np.ones((16, 8), np.float32)

    edit_tensors(destination, nest)
    return destination


def fused_experts_copy(folder: str, destination: str, num_experts: int) -> str:
    """The experts of every layer stored fused, as Qwen3.5-MoE checkpoints do:
    mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj [E, H, I]."""
    shutil.copytree(folder, destination, dirs_exist_ok=True)

    def fuse(tensors: dict) -> None:
        prefixes = sorted({n.split("experts.")[0] for n in tensors if ".experts.0." in n})
        for prefix in prefixes:
            base = prefix + "experts."
            gate_up = [np.concatenate([tensors.pop(f"{base}{e}.gate_proj.weight"),
                                       tensors.pop(f"{base}{e}.up_proj.weight")])
                       for e in range(num_experts)]
            down = [tensors.pop(f"{base}{e}.down_proj.weight") for e in range(num_experts)]
            tensors[base + "gate_up_proj"] = np.stack(gate_up)
            tensors[base + "down_proj"] = np.stack(down)

    edit_tensors(destination, fuse)
    return destination


def mtp_copy(folder: str, destination: str, *, embedding_scale: float = 100.0, seed: int = 0
             ) -> str:
    """A copy with `mtp.*` tensors under the names and shapes Qwen3-Next and Qwen3.5 checkpoints
    ship (mtp.fc [H, 2H], mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden, mtp.norm, and one
    decoder layer mtp.layers.0.* shaped as the trunk's full-attention layers), and with the
    embedding scaled by `embedding_scale`: the target's next token then leans on the current
    token, and a head whose fc passes the token's embedding through guesses it often but not
    always (so drafts are both kept and rejected)."""
    shutil.copytree(folder, destination, dirs_exist_ok=True)
    with open(os.path.join(folder, "config.json")) as handle:
        config = json.load(handle)
    text = config.get("text_config", config)  # nested (Qwen3.5 as shipped) or flat
    text["mtp_num_hidden_layers" if text["model_type"] != "qwen3_next"
         else "num_nextn_predict_layers"] = 1
    with open(os.path.join(destination, "config.json"), "w") as handle:
        json.dump(config, handle)
    attention_layer = text["layer_types"].index("full_attention")
    rng = np.random.default_rng(seed)

    def add_head(tensors: dict) -> None:
        trunk = "model.language_model." if "text_config" in config else "model."
        tensors[trunk + "embed_tokens.weight"] *= np.float32(embedding_scale)
        hidden = tensors[trunk + "embed_tokens.weight"].shape[1]
        source = f"{trunk}layers.{attention_layer}."
        for name in [n for n in tensors if n.startswith(source)]:
            value = tensors[name]
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                value = value * np.float32(0.3)
            tensors["mtp.layers.0." + name[len(source):]] = value.copy()
        noise = rng.standard_normal((hidden, hidden)).astype(np.float32) * np.float32(0.02)
        passing = np.eye(hidden, dtype=np.float32) * np.float32(10.0)
        tensors["mtp.fc.weight"] = np.concatenate([passing, noise], axis=1)
        for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            tensors[f"mtp.{norm}.weight"] = np.zeros(hidden, np.float32)

    edit_tensors(destination, add_head)
    return destination


@pytest.fixture(scope="session")
def hybrid_checkpoints(tmp_path_factory) -> dict[str, str]:
    """variant name -> folder, for HYBRID_VARIANTS plus "qwen3_5-nested"."""
    folders = {variant: build_hybrid_checkpoint(str(tmp_path_factory.mktemp(variant)), variant)
               for variant in HYBRID_VARIANTS}
    folders["qwen3_5-nested"] = nested_qwen3_5_copy(
        folders["qwen3_5"], str(tmp_path_factory.mktemp("qwen3_5-nested")))
    return folders


@pytest.fixture(scope="session")
def hybrid_targets(hybrid_checkpoints):
    """variant name -> model on the default torch CPU backend, built on first use."""
    from exactdraft.pretrained import build_target, load_checkpoint

    built: dict[str, object] = {}

    def get(variant: str):
        if variant not in built:
            built[variant] = build_target(load_checkpoint(hybrid_checkpoints[variant]), "torch")
        return built[variant]

    return get
