"""MTPDrafter: the checkpoint's own multi-token-prediction layers (`mtp.*`, written by the test
under the names and shapes Qwen3-Next and Qwen3.5 checkpoints ship) propose the drafts; the head
computes what transformers' decoder layer computes with those weights; drafted output equals
serial output at depths 1-3 with drafts kept and rejected."""

from __future__ import annotations

import numpy as np
import pytest

import exactdraft as xd
from exactdraft import DraftContext, KeyedSampler, MTPDrafter, SamplingParams
from tests.exactness import ExactnessCheck
from tests.hybrid_checkpoints import mtp_copy
from tests.test_generator import FILTERS

MTP_VARIANTS = ("qwen3_next", "qwen3_5", "qwen3_5-nested")
PROMPT = [5, 6, 7, 8, 9, 10, 11]


@pytest.fixture(scope="module")
def mtp_folders(hybrid_checkpoints, tmp_path_factory):
    return {variant: mtp_copy(hybrid_checkpoints[variant],
                              str(tmp_path_factory.mktemp(f"{variant}-mtp")))
            for variant in MTP_VARIANTS}


@pytest.fixture(scope="module")
def mtp_targets(mtp_folders):
    from exactdraft.pretrained import build_target, load_checkpoint

    return {variant: build_target(load_checkpoint(folder), "torch")
            for variant, folder in mtp_folders.items()}


def test_the_head_reads_the_real_tensor_names(mtp_folders):
    import transformers
    from safetensors import safe_open

    with safe_open(f"{mtp_folders['qwen3_next']}/model.safetensors", "np") as handle:
        names = {name for name in handle.keys() if name.startswith("mtp.")}
    assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
            "mtp.pre_fc_norm_hidden.weight", "mtp.layers.0.input_layernorm.weight",
            "mtp.layers.0.post_attention_layernorm.weight", "mtp.layers.0.self_attn.q_proj.weight",
            "mtp.layers.0.self_attn.q_norm.weight", "mtp.layers.0.mlp.gate.weight",
            "mtp.layers.0.mlp.experts.3.down_proj.weight",
            "mtp.layers.0.mlp.shared_expert_gate.weight"} <= names
    model = transformers.AutoModelForCausalLM.from_pretrained(mtp_folders["qwen3_next"])
    assert not any(name.startswith("mtp.") for name in model.state_dict())  # dropped


@pytest.mark.parametrize("variant", MTP_VARIANTS[:2])
def test_the_head_computes_the_checkpoints_mtp_layer(variant, mtp_folders, mtp_targets):
    """Against transformers' own decoder layer (and RMS norm) loaded with the mtp.* weights:
    fc over [norm(embedding of token t+1); norm(hidden row t)], the layer, the norm, lm_head."""
    import torch
    import transformers
    from safetensors.numpy import load_file

    target = mtp_targets[variant]
    target.keep_hidden = True
    tokens = list(range(3, 40))
    state = target.new_state()
    target.forward(state, tokens, rows="all")
    hidden = state.take_hidden(0, len(tokens))
    head_state = target.mtp.new_state()
    logits, _ = target.mtp.forward(head_state, tokens[1:], hidden[:-1])

    model = transformers.AutoModelForCausalLM.from_pretrained(mtp_folders[variant]).eval()
    config = model.config
    weights = load_file(f"{mtp_folders[variant]}/model.safetensors")
    module = __import__(type(model).__module__, fromlist=["x"])
    prefix = type(model).__name__.replace("ForCausalLM", "")
    index = config.layer_types.index("full_attention")
    layer = getattr(module, f"{prefix}DecoderLayer")(config, index).eval()
    layer.load_state_dict(transformers_layout({name[len("mtp.layers.0."):]: value
                                               for name, value in weights.items()
                                               if name.startswith("mtp.layers.0.")}))

    def norm(name, x):
        rms = getattr(module, f"{prefix}RMSNorm")(config.hidden_size, eps=config.rms_norm_eps)
        rms.weight.data = torch.from_numpy(weights[f"mtp.{name}.weight"])
        return rms(x)

    with torch.no_grad():
        ids = torch.tensor([tokens[1:]])
        embedded = norm("pre_fc_norm_embedding", model.model.embed_tokens(ids))
        carried = norm("pre_fc_norm_hidden", torch.from_numpy(hidden[None, :-1]))
        x = torch.cat([embedded, carried], -1) @ torch.from_numpy(weights["mtp.fc.weight"]).T
        positions = torch.arange(ids.shape[1])[None]
        rope = model.model.rotary_emb(x, positions)
        mask = torch.full((ids.shape[1], ids.shape[1]), float("-inf")).triu(1)[None, None]
        x = layer(x, position_embeddings=rope, attention_mask=mask, position_ids=positions)
        reference = model.lm_head(norm("norm", x))[0].numpy()
    scale = np.abs(reference).max()
    assert scale > 1.0 and np.abs(logits - reference).max() <= 2e-5 * scale


def transformers_layout(weights: dict) -> dict:
    """A layer's tensors as transformers' modules hold them: experts fused into
    experts.gate_up_proj [E, 2I, H] and experts.down_proj [E, H, I]."""
    import torch

    out = {name: torch.from_numpy(value) for name, value in weights.items()
           if ".experts." not in name}
    count = len({name.split(".")[2] for name in weights if name.startswith("mlp.experts.")})
    if count:
        out["mlp.experts.gate_up_proj"] = torch.from_numpy(np.stack([np.concatenate(
            [weights[f"mlp.experts.{e}.gate_proj.weight"],
             weights[f"mlp.experts.{e}.up_proj.weight"]]) for e in range(count)]))
        out["mlp.experts.down_proj"] = torch.from_numpy(np.stack(
            [weights[f"mlp.experts.{e}.down_proj.weight"] for e in range(count)]))
    return out


def test_guesses_are_the_heads_keyed_samples(mtp_targets):
    target = mtp_targets["qwen3_5"]
    params = SamplingParams(temperature=0.8, top_k=40, seed=4)
    drafter = MTPDrafter(target, max_draft=1)
    drafter.begin(PROMPT, DraftContext(params, KeyedSampler(), len(PROMPT)))
    state = target.new_state()
    target.forward(state, PROMPT)
    sequence = PROMPT + [12]
    guess = drafter.propose(sequence, 4)
    logits, _ = target.mtp.forward(target.mtp.new_state(), sequence[1:],
                                   _hidden_of(target, PROMPT))
    expected = KeyedSampler().sample(logits[-1], params, pos=len(sequence), history=sequence,
                                     n_prompt=len(PROMPT))
    assert guess == [expected]


def _hidden_of(target, tokens):
    state = target.new_state()
    target.forward(state, tokens)
    return state.take_hidden(0, len(tokens))


@pytest.mark.parametrize("variant,depth", [(v, d) for v in MTP_VARIANTS[:2] for d in (1, 2, 3)]
                         + [("qwen3_5-nested", 2)])
def test_drafted_equals_serial_with_mtp_drafts(variant, depth, mtp_targets):
    target = mtp_targets[variant]
    serial = xd.Generator(target)
    generator = xd.Generator(target, MTPDrafter(target, max_draft=depth, adaptive=False),
                             adaptive_depth=False)
    check = ExactnessCheck()
    for seed, (temperature, filter_name) in enumerate([(0.0, "plain"), (0.7, "top_p"),
                                                       (1.0, "combined"), (1.5, "min_p")]):
        params = xd.SamplingParams(temperature=temperature, seed=seed, **FILTERS[filter_name])
        check.compare(generator, PROMPT, 24, params, serial=serial, stop_tokens=[])
    check.assert_exact(min_accepted=5, some_rejected=True)


def test_adaptive_depth_follows_acceptance(mtp_targets):
    drafter = MTPDrafter(mtp_targets["qwen3_5"], max_draft=3)
    assert drafter.depth() == 3
    for _ in range(10):
        drafter.accepted(3, 0)
    assert drafter.depth() == 1
    for _ in range(30):
        drafter.accepted(3, 3)
    assert drafter.depth() == 3


def test_bad_uses_are_refused(mtp_targets, hybrid_targets):
    with pytest.raises(ValueError, match="multi-token-prediction"):
        MTPDrafter(hybrid_targets("qwen3_5"))
    with pytest.raises(ValueError, match="max_draft"):
        MTPDrafter(mtp_targets["qwen3_5"], max_draft=4)
