"""Gemma 4 text models on tiny random checkpoints built with transformers: logits against
transformers' Gemma4ForCausalLM (one checkpoint with every Gemma 4 feature: per-layer inputs,
KV shared by the last layers, wider global heads with fewer KV heads and values equal to keys,
proportional rope, experts beside the MLP, double-wide MLPs, layer scalars, soft-capped logits;
one plain), the multimodal config's text part, chunked prefill and W-row passes against
single steps bitwise, token trees, and drafted == serial at temperature 0.8 with a negative
control whose per-layer inputs depend on the other rows of the pass."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.errors import ConfigError
from exactdraft.guard import probe_tokens
from exactdraft.models.gemma4_layers import PerLayerInputs
from tests.exactness import ExactnessCheck, OracleDrafter
from tests.hybrid_checkpoints import edit_tensors
from tests.models.test_hybrid import serial_run, state_bytes
from tests.models.test_moe import hf_logits, relative_error

VARIANTS = {
    "full": dict(num_hidden_layers=5, num_attention_heads=3, num_key_value_heads=3,
                 head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                 attention_k_eq_v=True, num_kv_shared_layers=2,
                 layer_types=["sliding_attention", "full_attention", "sliding_attention",
                              "sliding_attention", "full_attention"],
                 hidden_size_per_layer_input=8, vocab_size_per_layer_input=128,
                 use_double_wide_mlp=True, final_logit_softcapping=5.0, sliding_window=8,
                 enable_moe_block=True, num_experts=4, top_k_experts=2,
                 moe_intermediate_size=32),
    # No layer_types: every layer slides by the 5:1 pattern but the last, which is global;
    # an output matrix of its own.
    "plain": dict(num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1,
                  head_dim=16, global_head_dim=32, hidden_size_per_layer_input=0,
                  sliding_window=8, tie_word_embeddings=False,
                  rope_parameters={"sliding_attention": {"rope_type": "default",
                                                         "rope_theta": 10000.0},
                                   "full_attention": {"rope_type": "default",
                                                      "rope_theta": 100000.0}}),
}


def build_gemma4(folder: str, variant: str) -> str:
    from tests.conftest import build_tiny_checkpoint

    build_tiny_checkpoint(folder, "llama", model_type="gemma4_text", **VARIANTS[variant])
    # transformers leaves the layer scalars (buffers) at 1: give them values.
    edit_tensors(folder, lambda t: t.update({
        name: np.array([0.5 + 0.25 * i], np.float32)
        for i, name in enumerate(sorted(n for n in t if n.endswith("layer_scalar")))}))
    return folder


def nested_copy(folder: str, destination: str) -> str:
    """The flat checkpoint as a multimodal Gemma 4 ships it: text under text_config and
    model.language_model., a vision tower beside it (ignored)."""
    shutil.copytree(folder, destination, dirs_exist_ok=True)
    with open(os.path.join(folder, "config.json")) as handle:
        text = json.load(handle)
    with open(os.path.join(destination, "config.json"), "w") as handle:
        json.dump({"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
                   "text_config": text, "vision_config": {"model_type": "gemma4_vision"}},
                  handle)

    def nest(tensors: dict) -> None:
        for name in [n for n in tensors if n.startswith("model.")]:
            tensors["model.language_model." + name[len("model."):]] = tensors.pop(name)
        tensors["model.vision_tower.patch_embedder.weight"] = np.ones((8, 3), np.float32)

    edit_tensors(destination, nest)
    return destination


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    built = {variant: build_gemma4(str(tmp_path_factory.mktemp(f"gemma4-{variant}")), variant)
             for variant in VARIANTS}
    built["nested"] = nested_copy(built["full"], str(tmp_path_factory.mktemp("gemma4-nested")))
    return built


@pytest.fixture(scope="module")
def targets(folders):
    from exactdraft.pretrained import build_target, load_checkpoint

    return {name: build_target(load_checkpoint(folder), "torch")
            for name, folder in folders.items()}


def test_the_config_maps_every_gemma4_feature(targets):
    c = targets["full"].config
    assert c.sliding == (True, False, True, True, False)
    assert c.head_dims == (16, 32, 16, 16, 32) and c.kv_heads == (3, 1, 3, 3, 1)
    assert c.kv_sources == (0, 1, 2, 2, 1)  # the last two read the last earlier of their type
    assert [c.mlp_size(i) for i in range(5)] == [96, 96, 96, 192, 192]
    assert c.keys_are_values and c.per_layer_size == 8 and c.num_experts == 4
    # Global layers' values are their keys' projection: no v rows are held for them.
    assert [layer.mixer.values_are_keys for layer in targets["full"].layers[:3]] == [
        False, True, False]
    assert c.final_logit_softcapping == 5.0
    plain = targets["plain"].config
    assert plain.sliding == (True, True, False) and plain.kv_sources == (0, 1, 2)
    assert plain.head_dims == (16, 16, 32) and plain.kv_heads == (1, 1, 1)
    assert c.tie_word_embeddings and not plain.tie_word_embeddings
    # Slots of different shapes: no KV prefix export; one shape: export.
    assert not targets["full"].capabilities.kv_prefixes
    assert [tuple(k.shape) for k in targets["full"].new_state().cache.keys][:2] == [
        (3, 256, 16), (1, 256, 32)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_transformers(variant, folders, targets):
    assert_parity(targets[variant], folders[variant])


def assert_parity(target, folder: str) -> None:
    tokens = probe_tokens(40, target.vocab_size, salt=3)  # longer than the sliding window
    ours = target.forward(target.new_state(), tokens, rows="all")
    assert relative_error(ours, hf_logits(folder, tuple(tokens))) < 2e-5


def test_parity_can_fail_without_a_feature(folders, targets):
    """Negative control: the same model with its per-layer inputs or soft-cap left out is far
    from transformers' logits."""
    target = targets["full"]
    tokens = probe_tokens(40, target.vocab_size, salt=3)
    reference = hf_logits(folders["full"], tuple(tokens))
    gates = [layer.per_layer_gate for layer in target.layers]
    try:
        for layer in target.layers:
            layer.per_layer_gate = None
        assert relative_error(target.forward(target.new_state(), tokens, rows="all"),
                              reference) > 1e-2
    finally:
        for layer, gate in zip(target.layers, gates):
            layer.per_layer_gate = gate
    target.softcap = None
    try:
        assert relative_error(target.forward(target.new_state(), tokens, rows="all"),
                              reference) > 1e-2
    finally:
        target.softcap = 5.0


def test_the_multimodal_config_loads_the_text_model_alone(targets):
    nested, flat = targets["nested"], targets["full"]
    assert nested.trunk.model_type == "gemma4_text"
    tokens = probe_tokens(30, flat.vocab_size, salt=8)
    assert nested.forward(nested.new_state(), tokens, rows="all").tobytes() == \
        flat.forward(flat.new_state(), tokens, rows="all").tobytes()


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_chunked_prefill_equals_one_pass(variant, targets):
    target = targets[variant]
    tokens = probe_tokens(50, target.vocab_size, salt=5)
    whole_state = target.new_state()
    whole = target.forward(whole_state, tokens, rows="all")
    for chunks in ([1] * 6 + [44], [7, 23, 20], [30, 1, 19]):
        state, begin = target.new_state(), 0
        for size in chunks:
            rows = target.forward(state, tokens[begin:begin + size], rows="all")
            assert rows.tobytes() == whole[begin:begin + size].tobytes(), (variant, chunks)
            begin += size
        assert state_bytes(state) == state_bytes(whole_state)


def test_verify_window_equals_single_steps(targets):
    target = targets["full"]
    tokens = probe_tokens(21, target.vocab_size, salt=1) + probe_tokens(8, 128, salt=2)
    singles, _ = serial_run(target, tokens)
    state = target.new_state()
    target.forward(state, tokens[:21])
    for width in range(1, 9):
        target.truncate(state, 21)
        rows = target.forward(state, tokens[21:21 + width], rows="all")
        assert [row.tobytes() for row in rows] == singles[21:21 + width], width


def test_a_token_tree_row_equals_its_serial_path(targets):
    target = targets["full"]
    assert target.capabilities.verifies_trees
    prompt = probe_tokens(15, target.vocab_size, salt=4)
    tree, parents = [11, 12, 13, 14, 15], [-1, 0, 0, 1, 2]
    state = target.new_state()
    target.forward(state, prompt)
    rows = target.forward_tree(state, tree, parents)
    for leaf, path in ((3, [0, 1, 3]), (4, [0, 2, 4])):
        serial = target.new_state()
        expected = target.forward(serial, prompt + [tree[i] for i in path])
        assert rows[leaf].tobytes() == expected[0].tobytes()
    target.commit_tree(state, [0, 2, 4])
    serial = target.new_state()
    target.forward(serial, prompt + [11, 13, 15])
    assert state_bytes(state) == state_bytes(serial)


def test_batched_rows_equal_each_sequence_alone(targets):
    """Sequences sharing passes (one joining late, one leaving early): each row's per-layer
    inputs and shared keys are its own sequence's, so it has the bits of its sequence alone."""
    from tests.models.test_batched import alone, passes, together

    target = targets["full"]
    sequences = [passes(salt) for salt in range(3)]
    sequences[1] = sequences[1][:3]
    assert together(target, sequences) == [alone(target, s) for s in sequences]


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_padded_backend_keeps_parity_and_the_invariants(variant, folders):
    from exactdraft.guard import check_row_invariance
    from exactdraft.pretrained import build_target, load_checkpoint

    target = build_target(load_checkpoint(folders[variant]), "torch-padded")
    assert check_row_invariance(target, 5) is None
    assert_parity(target, folders[variant])
    tokens = probe_tokens(40, target.vocab_size, salt=5)
    whole = target.forward(target.new_state(), tokens, rows="all")
    state = target.new_state()
    first = target.forward(state, tokens[:3], rows="all")
    assert first.tobytes() + target.forward(state, tokens[3:], rows="all").tobytes() == \
        whole.tobytes()


def drafted_against_serial(target, guard: bool) -> ExactnessCheck:
    serial = xd.Generator(target)
    check = ExactnessCheck()
    prompt = probe_tokens(12, target.vocab_size, salt=9)
    for seed in range(3):
        params = xd.SamplingParams(temperature=0.8, top_p=0.95, seed=seed)
        expected = serial.generate(prompt, 24, params, stop_tokens=[])
        generator = xd.Generator(target, OracleDrafter(expected.tokens, 4, 0.3, seed),
                                 adaptive_depth=False, guard=guard)
        check.compare(generator, prompt, 24, params, serial=serial, stop_tokens=[])
    return check


def test_drafted_equals_serial_at_temperature_0_8(targets):
    drafted_against_serial(targets["full"], guard=True).assert_exact(some_rejected=True)


def test_negative_control_pass_dependent_per_layer_inputs_are_caught(folders, monkeypatch):
    """Per-layer inputs centred over the pass's rows (a row's input then depends on its
    neighbours): drafted output differs from serial."""
    from exactdraft.pretrained import build_target, load_checkpoint

    rows_of = PerLayerInputs.layer_rows

    def centred(self, be, layer, embedded):
        rows = rows_of(self, be, layer, embedded)
        return rows - rows.mean(axis=0)

    monkeypatch.setattr(PerLayerInputs, "layer_rows", centred)
    target = build_target(load_checkpoint(folders["full"]), "torch")
    drafted_against_serial(target, guard=False).assert_caught()


@pytest.mark.parametrize("edit,field", [
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ({"num_kv_shared_layers": 5}, "num_kv_shared_layers"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn"}}}, "rope_type"),
    ({"per_layer_config": {"1": {"sliding_window": 4}}}, "sliding_window"),
    ({"attention_bias": True}, "attention_bias"),
    ({"hidden_activation": "silu"}, "hidden_activation"),
    ({"top_k_experts": 5}, "top_k_experts"),
])
def test_bad_configs_are_refused_by_name(edit, field, folders):
    from exactdraft.models.families.gemma4 import config_from_hf

    with open(os.path.join(folders["full"], "config.json")) as handle:
        raw = json.load(handle)
    config_from_hf(raw, "config.json")  # the unedited config maps
    with pytest.raises(ConfigError, match=field):
        config_from_hf({**raw, **edit}, "config.json")
    with pytest.raises(ConfigError, match="text_config"):
        config_from_hf({"model_type": "gemma4"}, "config.json")


@pytest.mark.slow
def test_two_ranks_write_the_bits_of_one(folders, tmp_path):
    """TP=2 (two gloo ranks; every matrix split by output columns) against TP=1: chains, a
    batch, a token tree, truncation, serial, drafted and batched generation, bit for bit."""
    from tests.parallel.scenarios import same_bits
    from tests.parallel.test_tensor_parallel import run_both

    parallel, single, outcome = run_both(folders["full"], str(tmp_path), control=False)
    assert outcome["model"] == "Gemma4Model"
    assert "tree" in single and same_bits(parallel, single) == []


def test_one_kv_shape_exports_and_imports_prefixes(tmp_path):
    """With every KV slot of one shape (global layers no wider), prefixes export and import:
    the imported state continues with the computed state's bits."""
    from exactdraft.pretrained import build_target, load_checkpoint
    from tests.conftest import build_tiny_checkpoint

    settings = {**VARIANTS["full"], "global_head_dim": 16, "num_global_key_value_heads": 3}
    folder = build_tiny_checkpoint(str(tmp_path), "llama", model_type="gemma4_text", **settings)
    target = build_target(load_checkpoint(folder), "torch")
    assert target.capabilities.kv_prefixes
    tokens = probe_tokens(30, target.vocab_size, salt=7)
    computed = target.new_state()
    target.forward(computed, tokens[:20])
    keys, values = target.export_kv(computed, 0, 20)
    imported = target.new_state()
    target.import_kv(imported, keys, values)
    expected = target.forward(computed, tokens[20:], rows="all").tobytes()
    assert target.forward(imported, tokens[20:], rows="all").tobytes() == expected
    # Negative control: a prefix imported with its keys as values continues otherwise.
    wrong = target.new_state()
    target.import_kv(wrong, keys, keys)
    assert target.forward(wrong, tokens[20:], rows="all").tobytes() != expected
