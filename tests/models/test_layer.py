"""One model class for every family: each is a DecoderModel of Layers (a token mixer and a
feed-forward), declares the capabilities its kind had as its own class, runs fused where every
layer is one the backend fuses, and refuses what its state cannot do, naming why."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exactdraft.errors import ParameterError
from exactdraft.models.decoder import DecoderModel
from exactdraft.models.layer import Layer, fused_layer
from exactdraft.models.mixers import AttentionMixer, DenseMLP
from exactdraft.models.target import Capabilities
from tests.hybrid_checkpoints import MOE_FAMILIES, RECURRENT_FAMILIES

TRANSFORMERS = ("llama", "qwen3", "gemma3")


@pytest.mark.parametrize("variant", TRANSFORMERS)
def test_a_transformer_family_is_the_model_with_kv_prefixes_and_trees(variant, tiny_targets):
    target = tiny_targets[variant]
    assert type(target) is DecoderModel
    assert all(isinstance(layer.mixer, AttentionMixer) and
               isinstance(layer.feed_forward, DenseMLP) for layer in target.layers)
    assert target.capabilities == Capabilities(
        batches_sequences=True, kv_prefixes=True, verifies_trees=target.supports_trees,
        returns_features=True)
    assert target.supports_trees and target.state_holding([]) is None  # no token log


@pytest.mark.parametrize("variant", MOE_FAMILIES + RECURRENT_FAMILIES)
def test_a_hybrid_family_is_the_same_model_without_prefixes_or_trees(variant, hybrid_targets):
    target = hybrid_targets(variant)
    assert type(target) is DecoderModel
    assert target.capabilities == Capabilities(
        batches_sequences=True, returns_features=True, rolls_back_recurrent=True,
        describes_head_layer=True, carries_mtp=target.mtp is not None)
    assert bool(target.recurrent) == (variant in RECURRENT_FAMILIES)
    state = target.new_state()
    target.forward(state, [1, 2, 3])
    assert target.state_holding([1, 2, 3]) is state


@pytest.mark.parametrize("variant", ["qwen3_next", "nemotron_h"])
def test_a_recurrent_model_refuses_trees_and_kv_prefixes(variant, hybrid_targets,
                                                         tiny_targets):
    target = hybrid_targets(variant)
    state = target.new_state()
    target.forward(state, [1, 2, 3])
    with pytest.raises(ParameterError, match="recurrent layers"):
        target.forward_tree(state, [4, 5], [-1, 0])
    with pytest.raises(ParameterError, match="does not export KV prefixes"):
        target.export_kv(state, 0, 3)
    with pytest.raises(ParameterError, match="does not export KV prefixes"):
        target.import_kv(state, np.zeros((1, 1, 1, 1), np.float32),
                         np.zeros((1, 1, 1, 1), np.float32))
    assert state.length == 3  # nothing was appended by the refused calls
    with pytest.raises(ParameterError, match="nor hold token trees"):
        DecoderModel(dataclasses.replace(target.trunk, verifies_trees=True), target.backend)
    with pytest.raises(ParameterError, match="neither export KV prefixes"):
        DecoderModel(dataclasses.replace(target.trunk, kv_prefixes=True), target.backend)
    # Control: a transformer's state is its KV cache, so the same calls go through.
    llama = tiny_targets["llama"]
    state = llama.new_state()
    llama.forward(state, [1, 2, 3])
    keys, values = llama.export_kv(state, 0, 3)
    fresh = llama.new_state()
    llama.import_kv(fresh, keys, values)
    assert fresh.length == 3


def test_only_stacks_of_fusable_layers_run_fused(tiny_checkpoints, hybrid_checkpoints):
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.pretrained import build_target, load_checkpoint

    llama = build_target(load_checkpoint(tiny_checkpoints["llama"]), TorchCPUBackend())
    assert llama.plans is not None and len(llama.plans) == len(llama.layers)
    moe = build_target(load_checkpoint(hybrid_checkpoints["qwen3_moe"]), TorchCPUBackend())
    assert moe.plans is None  # its MoE layers have no fused form
    first = llama.layers[0]
    decoder_layer, shape = fused_layer(first, 0, llama.trunk.eps, llama.trunk.hidden_size)
    assert decoder_layer.qkv is first.mixer.qkv and shape.activation == "silu"
    # Each of these leaves the fused form: the layer could not keep its bits there.
    gated = dataclasses.replace(first.mixer, gated=True)
    relu2 = dataclasses.replace(first.feed_forward, activation="relu2")
    for changed, index in ((Layer(first.mixer_norm, gated, first.feed_forward_norm,
                                  first.feed_forward), 0),
                           (Layer(first.mixer_norm, first.mixer, first.feed_forward_norm,
                                  relu2), 0),
                           (Layer(first.mixer_norm, first.mixer), 0),
                           (first, 1)):  # another layer's KV slot
        assert fused_layer(changed, index, llama.trunk.eps, llama.trunk.hidden_size) is None


def test_a_tree_on_a_trunk_that_logs_tokens_keeps_the_path_tokens(hybrid_targets):
    """The token log follows a committed tree path (a mixture-of-experts trunk, which has no
    recurrent layers, declared to verify trees): after commit_tree the state holds what serial
    steps over the path leave, its tokens and its next logits alike."""
    moe = hybrid_targets("qwen3_moe")
    target = DecoderModel(dataclasses.replace(moe.trunk, verifies_trees=True), moe.backend)
    assert target.supports_trees
    prompt, tree, parents, path = [5, 9, 2], [11, 12, 13, 14], [-1, 0, 0, 2], [0, 2, 3]
    state = target.new_state()
    target.forward(state, prompt)
    tree_logits = target.forward_tree(state, tree, parents)
    target.commit_tree(state, path)
    serial = target.new_state()
    target.forward(serial, prompt)
    walked = target.forward(serial, [tree[i] for i in path], rows="all")
    assert state.tokens == serial.tokens == prompt + [11, 13, 14]
    assert tree_logits[path].tobytes() == walked.tobytes()
    following = target.forward(serial, [7]).tobytes()
    assert target.forward(state, [7]).tobytes() == following
    # Control: committing another path leaves other tokens and other next logits.
    other = target.new_state()
    target.forward(other, prompt)
    target.forward_tree(other, tree, parents)
    target.commit_tree(other, [0, 1])
    assert other.tokens == prompt + [11, 12]
    assert target.forward(other, [7]).tobytes() != following
