"""MTPDrafter on the MTP layer DeepSeek-V3 and GLM-4.5 checkpoints store after the trunk
(`model.layers.{L}.` with enorm, hnorm, eh_proj, shared_head.norm and shared_head.head, written
by the test under those names): the head reads them, its state holds the family's cache (latents
and rope keys for DeepSeek-V3), and drafted output equals serial output at T=0.8 with drafts
kept and rejected."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import exactdraft as xd
from exactdraft import MTPDrafter
from exactdraft.models.latent_attention import LatentCache
from tests.exactness import ExactnessCheck
from tests.hybrid_checkpoints import edit_tensors
from tests.models.families.test_deepseek_v3 import DEEPSEEK_V3, build_checkpoint, load
from tests.models.families.test_glm4_moe import GLM4_MOE

PROMPT = [5, 6, 7, 8, 9, 10, 11]


def nextn_copy(folder: str, destination: str, seed: int = 0) -> str:
    """A copy with one MTP layer after the trunk: the last layer's tensors (its attention and
    MLP outputs scaled down), eh_proj passing the token's embedding through, norms of ones, and
    shared_head.head a copy of lm_head; the embedding is scaled up so that the target's next
    token leans on the current one and the head guesses it often but not always."""
    shutil.copytree(folder, destination, dirs_exist_ok=True)
    with open(os.path.join(folder, "config.json")) as handle:
        layers = json.load(handle)["num_hidden_layers"]
    rng = np.random.default_rng(seed)

    def add_layer(tensors: dict) -> None:
        tensors["model.embed_tokens.weight"] *= np.float32(100.0)
        hidden = tensors["model.embed_tokens.weight"].shape[1]
        source, head = f"model.layers.{layers - 1}.", f"model.layers.{layers}."
        for name in [n for n in tensors if n.startswith(source)]:
            value = tensors[name]
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                value = value * np.float32(0.3)
            tensors[head + name[len(source):]] = value.copy()
        noise = rng.standard_normal((hidden, hidden)).astype(np.float32) * np.float32(0.02)
        tensors[head + "eh_proj.weight"] = np.concatenate(
            [np.eye(hidden, dtype=np.float32) * np.float32(10.0), noise], axis=1)
        for norm in ("enorm", "hnorm", "shared_head.norm"):
            tensors[f"{head}{norm}.weight"] = np.ones(hidden, np.float32)
        tensors[head + "shared_head.head.weight"] = tensors["lm_head.weight"].copy()

    edit_tensors(destination, add_layer)
    return destination


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    built = {}
    for name, settings in (("deepseek_v3", DEEPSEEK_V3), ("glm4_moe", GLM4_MOE)):
        folder = build_checkpoint(str(tmp_path_factory.mktemp(name)), settings)
        built[name] = load(nextn_copy(folder, str(tmp_path_factory.mktemp(f"{name}-mtp"))))
    return built


def test_the_head_is_read_from_the_layer_after_the_trunk(targets):
    latent, grouped = targets["deepseek_v3"], targets["glm4_moe"]
    assert latent.mtp is not None and grouped.mtp is not None
    assert len(latent.layers) == 3 and len(latent.mtp.layers) == 1
    assert isinstance(latent.mtp.new_state().cache, LatentCache)
    assert not isinstance(grouped.mtp.new_state().cache, LatentCache)
    assert latent.mtp.layers[0].mixer.kv_slot == 0


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_drafted_equals_serial_with_mtp_drafts(family, targets):
    target = targets[family]
    serial = xd.Generator(target)
    check = ExactnessCheck()
    for depth in (1, 2, 3):
        generator = xd.Generator(target, MTPDrafter(target, max_draft=depth, adaptive=False),
                                 adaptive_depth=False)
        params = xd.SamplingParams(temperature=0.8, top_p=0.95, seed=depth)
        check.compare(generator, PROMPT, 24, params, serial=serial, stop_tokens=[])
    check.assert_exact(min_accepted=5, some_rejected=True)


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_the_head_computes_the_checkpoints_mtp_layer(family, targets):
    """Against transformers' own decoder layer and RMS norm loaded with the layer-L weights:
    eh_proj over [enorm(embedding of token t+1); hnorm(hidden row t)], the layer,
    shared_head.norm, shared_head.head."""
    import torch
    import transformers
    from safetensors.numpy import load_file

    from tests.drafters.test_mtp import transformers_layout

    target = targets[family]
    folder = os.path.dirname(target.trunk.source) if os.path.isfile(target.trunk.source) \
        else target.trunk.source
    target.keep_hidden = True
    tokens = list(range(3, 40))
    state = target.new_state()
    target.forward(state, tokens, rows="all")
    hidden = state.take_hidden(0, len(tokens))
    logits, _ = target.mtp.forward(target.mtp.new_state(), tokens[1:], hidden[:-1])

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    config, layers = model.config, model.config.num_hidden_layers
    weights = load_file(f"{folder}/model.safetensors")
    module = __import__(type(model).__module__, fromlist=["x"])
    prefix = type(model).__name__.replace("ForCausalLM", "")
    layer = getattr(module, f"{prefix}DecoderLayer")(config, layers).eval()
    head = f"model.layers.{layers}."
    own = {name[len(head):]: value for name, value in weights.items() if name.startswith(head)}
    layer.load_state_dict(transformers_layout({
        name: value for name, value in own.items()
        if not name.startswith(("enorm", "hnorm", "eh_proj", "shared_head"))}))

    norm = {name: getattr(module, f"{prefix}RMSNorm")(config.hidden_size,
                                                       eps=config.rms_norm_eps)
            for name in ("enorm", "hnorm", "shared_head.norm")}
    for name, rms in norm.items():
        rms.weight.data = torch.from_numpy(own[f"{name}.weight"])

    with torch.no_grad():
        ids = torch.tensor([tokens[1:]])
        joined = torch.cat([norm["enorm"](model.model.embed_tokens(ids)),
                            norm["hnorm"](torch.from_numpy(hidden[None, :-1]))], -1)
        x = joined @ torch.from_numpy(own["eh_proj.weight"]).T
        positions = torch.arange(ids.shape[1])[None]
        mask = torch.full((ids.shape[1], ids.shape[1]), float("-inf")).triu(1)[None, None]
        x = layer(x, position_embeddings=model.model.rotary_emb(x, positions),
                  attention_mask=mask, position_ids=positions)
        reference = (norm["shared_head.norm"](x) @
                     torch.from_numpy(own["shared_head.head.weight"]).T)[0].numpy()
    scale = np.abs(reference).max()
    assert scale > 1.0 and np.abs(logits - reference).max() <= 2e-5 * scale
