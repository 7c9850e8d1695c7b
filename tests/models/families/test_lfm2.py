"""LFM2 beyond what the shared hybrid tests check of it (tests/models/test_hybrid.py and
tests/test_hybrid_generation.py run the tiny `lfm2` of tests/hybrid_checkpoints.py: parity with
transformers, W-row passes, chunked prefill, rollback at every depth, drafted == serial):
the convolution's biases and a 4-tap kernel against transformers (and the guard's checks),
the config keys LiquidAI's files use, drafted == serial at temperature 0.8, and the negative
controls: a convolution that forgets its state between passes, and a rollback that cuts only
the KV cache."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.errors import ConfigError
from exactdraft.guard import check_row_invariance, probe_tokens
from exactdraft.models.families.lfm2 import config_from_hf
from exactdraft.models.recurrent import F32
from exactdraft.models.short_conv import ShortConv
from tests.models.test_hybrid import fresh_target, kv_only_truncate
from tests.models.test_moe import hf_logits, relative_error
from tests.test_generator import every_family

# The convolution's biases (in_proj, conv, out_proj), a 4-tap kernel, the MLP size as given.
BIASED = dict(model_type="lfm2", num_hidden_layers=3, conv_L_cache=4, conv_bias=True,
              block_auto_adjust_ff_dim=False, layer_types=["full_attention", "conv", "conv"])


def test_biased_convolutions_match_transformers(tmp_path):
    from exactdraft.pretrained import build_target, load_checkpoint
    from tests.conftest import build_tiny_checkpoint

    folder = build_tiny_checkpoint(str(tmp_path / "biased"), "llama", **BIASED)
    target = build_target(load_checkpoint(folder), "torch")
    convolutions = [layer.mixer for layer in target.layers if type(layer.mixer) is ShortConv]
    assert len(convolutions) == 2 and all(
        m.conv_bias is not None and m.in_bias is not None and m.conv_weight.shape == (4, 64)
        for m in convolutions)
    tokens = probe_tokens(70, target.vocab_size, salt=3)
    ours = target.forward(target.new_state(), tokens, rows="all")
    assert relative_error(ours, hf_logits(folder, tuple(tokens))) < 2e-5
    assert check_row_invariance(target, 9) is None  # W-row passes and rollback, 4 taps


def test_config_maps_liquid_ai_keys():
    """block_ff_dim (two thirds, times the multiplier, rounded up to block_multiple_of),
    full_attn_idxs and tie_embedding, as LiquidAI's own config.json files have them."""
    raw = {"model_type": "lfm2", "vocab_size": 65536, "hidden_size": 2048,
           "num_hidden_layers": 6, "num_attention_heads": 32, "num_key_value_heads": 8,
           "block_ff_dim": 12288, "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256,
           "block_auto_adjust_ff_dim": True, "full_attn_idxs": [2, 5], "tie_embedding": True,
           "conv_L_cache": 3, "norm_eps": 1e-5, "rope_theta": 1000000.0, "eos_token_id": 7}
    c = config_from_hf(raw, "config.json")
    assert c.intermediate_size == 8192  # LFM2-1.2B's MLP
    assert c.attention_layers == (False, False, True, False, False, True)
    assert c.tie_word_embeddings and c.head_dim == 64 and c.conv_kernel == 3
    assert c.rope_theta == 1000000.0 and c.eos_token_ids == (7,)
    sizes = [config_from_hf({**raw, **change}, "c").intermediate_size for change in (
        {"block_ffn_dim_multiplier": None}, {"block_ff_dim": 1000},
        {"block_auto_adjust_ff_dim": False})]
    assert sizes == [8192, 768, 12288]
    assert config_from_hf({**raw, "full_attn_idxs": None}, "c").attention_layers == (True,) * 6
    with pytest.raises(ConfigError, match="config.json: layer_types"):
        config_from_hf({**raw, "layer_types": ["conv", "mamba"]}, "config.json")
    with pytest.raises(ConfigError, match="config.json: full_attn_idxs"):
        config_from_hf({**raw, "full_attn_idxs": "2"}, "config.json")


def test_drafted_equals_serial_at_temperature_0_8(hybrid_targets):
    every_family(hybrid_targets("lfm2"), True, temperatures=(0.8,),
                 seeds=range(3)).assert_exact(some_rejected=True)


# -- negative controls ---------------------------------------------------------------------

def forgetting_sequence(mixer: ShortConv):
    """The layer's own step, but starting every pass from an empty convolution state: exact
    within a pass, wrong across passes."""
    step = mixer._sequence

    def sequence(part, proj):
        taps = mixer.conv_weight.shape[0]
        part.state.recurrent[mixer.slot] = (np.zeros((taps - 1, mixer.hidden_size), F32),)
        return step(part, proj)

    return sequence


def test_negative_control_a_convolution_that_forgets_its_state_is_caught(hybrid_checkpoints):
    target = fresh_target(hybrid_checkpoints, "lfm2")
    for mixer in target.recurrent:
        mixer._sequence = forgetting_sequence(mixer)
    assert check_row_invariance(target, 9) is not None
    tokens = probe_tokens(30, target.vocab_size, salt=5)
    whole = target.forward(target.new_state(), tokens, rows="all")
    state = target.new_state()
    parts = np.concatenate([target.forward(state, tokens[a:b], rows="all")
                            for a, b in ((0, 6), (6, 30))])
    assert parts[:6].tobytes() == whole[:6].tobytes()
    assert parts.tobytes() != whole.tobytes()


def test_negative_control_a_kv_only_rollback_changes_the_output(hybrid_checkpoints):
    target = fresh_target(hybrid_checkpoints, "lfm2")
    target.truncate = kv_only_truncate
    assert check_row_invariance(target, 9) is not None
    every_family(target, False, temperatures=(0.8,), seeds=range(3)).assert_caught()
