"""Hybrid families (qwen3_next, qwen3_5, qwen3_5_moe, nemotron_h, lfm2): logits against
transformers, W-row passes against single steps, chunked against one-pass prefill and rollback
against the serial state, all bitwise, with negative controls: a chunked scan whose bits depend
on the chunk, and a rollback that truncates only the KV cache."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.errors import ConfigError, WeightError
from exactdraft.guard import check_row_invariance, probe_tokens
from exactdraft.models.gated_deltanet import GatedDeltaNet
from exactdraft.models.mamba2 import Mamba2
from exactdraft.models.recurrent import F32, tree_sum
from tests.hybrid_checkpoints import RECURRENT_FAMILIES
from tests.models.test_moe import hf_logits, relative_error

FAMILIES = list(RECURRENT_FAMILIES)


def fresh_target(hybrid_checkpoints, variant):
    from exactdraft.pretrained import build_target, load_checkpoint

    return build_target(load_checkpoint(hybrid_checkpoints[variant]), "torch")


def state_bytes(state) -> bytes:
    """The recurrent states and the held KV entries of a state, as raw bytes."""
    parts = [array.tobytes() for layer in state.recurrent for array in layer]
    length = state.length
    for buffers in (state.cache.keys, state.cache.values):
        parts += [np.asarray(buffer[:, :length]).tobytes() for buffer in buffers]
    return b"".join(parts)


def serial_run(target, tokens):
    """Logits bytes and state bytes after each single step."""
    state = target.new_state()
    logits, states = [], []
    for token in tokens:
        logits.append(target.forward(state, [token])[0].tobytes())
        states.append(state_bytes(state))
    return logits, states


@pytest.mark.parametrize("variant", FAMILIES)
def test_logits_match_transformers(variant, hybrid_checkpoints, hybrid_targets):
    target = hybrid_targets(variant)
    tokens = probe_tokens(70, target.vocab_size, salt=3)
    ours = target.forward(target.new_state(), tokens, rows="all")
    assert relative_error(ours, hf_logits(hybrid_checkpoints[variant], tuple(tokens))) < 2e-5


def test_nested_text_config_loads_the_text_model_alone(hybrid_targets):
    nested, flat = hybrid_targets("qwen3_5-nested"), hybrid_targets("qwen3_5")
    assert nested.trunk.model_type == "qwen3_5_text"
    tokens = probe_tokens(30, flat.vocab_size, salt=8)
    assert nested.forward(nested.new_state(), tokens, rows="all").tobytes() == \
        flat.forward(flat.new_state(), tokens, rows="all").tobytes()


@pytest.mark.parametrize("variant", FAMILIES)
def test_verify_window_equals_single_steps(variant, hybrid_targets):
    target = hybrid_targets(variant)
    tokens = probe_tokens(41, target.vocab_size, salt=1) + probe_tokens(9, 128, salt=2)
    singles, states = serial_run(target, tokens)
    state = target.new_state()
    target.forward(state, tokens[:41])
    for width in range(1, 10):
        target.truncate(state, 41)
        rows = target.forward(state, tokens[41:41 + width], rows="all")
        assert [row.tobytes() for row in rows] == singles[41:41 + width], (variant, width)
        assert state_bytes(state) == states[40 + width]


@pytest.mark.parametrize("variant", FAMILIES)
def test_chunked_prefill_equals_one_pass(variant, hybrid_targets):
    target = hybrid_targets(variant)
    tokens = probe_tokens(70, target.vocab_size, salt=5)
    whole_state = target.new_state()
    whole = target.forward(whole_state, tokens, rows="all")
    for chunks in ([1] * 6 + [64], [7, 33, 30], [40, 1, 29]):
        state, begin = target.new_state(), 0
        for size in chunks:
            rows = target.forward(state, tokens[begin:begin + size], rows="all")
            assert rows.tobytes() == whole[begin:begin + size].tobytes(), (variant, chunks)
            begin += size
        assert state_bytes(state) == state_bytes(whole_state)


@pytest.mark.parametrize("variant", FAMILIES)
def test_rollback_restores_the_serial_state_at_every_depth(variant, hybrid_targets):
    target = hybrid_targets(variant)
    tokens = probe_tokens(49, target.vocab_size, salt=6)
    singles, states = serial_run(target, tokens)
    state = target.new_state()
    target.forward(state, tokens[:40])
    for kept in range(0, 9):
        # A verify pass whose first `kept` drafts are right and the rest wrong, then the
        # verifier's cut.
        target.truncate(state, 40)
        wrong = probe_tokens(9 - kept, target.vocab_size, salt=30 + kept)
        target.forward(state, tokens[40:40 + kept] + wrong, rows="all")
        target.truncate(state, 40 + kept)
        assert state_bytes(state) == states[39 + kept], (variant, kept)
        assert target.forward(state, [tokens[40 + kept]])[0].tobytes() == singles[40 + kept]


def test_truncating_past_the_rollback_window_replays(hybrid_targets):
    target = hybrid_targets("qwen3_next")
    tokens = probe_tokens(80, target.vocab_size, salt=7)
    singles, states = serial_run(target, tokens)
    state = target.new_state()
    for token in tokens[:79]:
        target.forward(state, [token])
    # Held: the empty state and the last rollback_window + 1 lengths.
    assert sorted(state.snapshots) == [0, *range(79 - target.rollback_window, 80)]
    target.truncate(state, 10)
    assert state_bytes(state) == states[9]
    assert target.forward(state, [tokens[10]])[0].tobytes() == singles[10]
    with pytest.raises(ValueError, match="cannot truncate"):
        target.truncate(state, 12)


@pytest.mark.parametrize("variant", FAMILIES)
def test_the_guard_passes(variant, hybrid_targets):
    assert check_row_invariance(hybrid_targets(variant), 9) is None


# -- negative controls ---------------------------------------------------------------------

CHUNK = 4


def chunked_deltanet_scan(state, q, k, v, beta, decay, keep_from):
    """Gated DeltaNet in chunks of CHUNK rows with the decay factored out of each chunk (the
    state held undecayed, U = S / cumulative decay): the same values as the serial scan, other
    bits, and which bits depends on where the chunks start."""
    out, kept = np.empty(v.shape, F32), []
    for first in range(0, v.shape[0], CHUNK):
        undecayed, cumulative = state, np.ones(decay.shape[1], F32)
        for t in range(first, min(first + CHUNK, v.shape[0])):
            cumulative = cumulative * decay[t]
            key = k[t][:, :, None]
            remembered = tree_sum(undecayed * key, 0) * cumulative[:, None]
            delta = (v[t] - remembered) * beta[t][:, None]
            undecayed = undecayed + key * (delta / cumulative[:, None])[None]
            state = undecayed * cumulative[None, :, None]
            out[t] = tree_sum(state * q[t][:, :, None], 0)
            if t >= keep_from:
                kept.append(state)
    return out, state, kept


def chunked_mamba_scan(self):
    def scan(state, xs, b, c, dt, decay, keep_from):
        out, kept = np.empty(xs.shape, F32), []
        for first in range(0, xs.shape[0], CHUNK):
            undecayed, cumulative = state, np.ones(decay.shape[1], F32)
            for t in range(first, min(first + CHUNK, xs.shape[0])):
                cumulative = cumulative * decay[t]
                scaled = (dt[t][:, None] * xs[t]) / cumulative[:, None]
                undecayed = undecayed + b[t][:, :, None] * scaled[None]
                state = undecayed * cumulative[None, :, None]
                out[t] = tree_sum(state * c[t][:, :, None], 0) + self.skip[:, None] * xs[t]
                if t >= keep_from:
                    kept.append(state)
        return out, state, kept

    return scan


@pytest.mark.parametrize("variant", ["qwen3_next", "nemotron_h"])
def test_negative_control_a_chunked_scan_is_caught(variant, hybrid_checkpoints):
    target = fresh_target(hybrid_checkpoints, variant)
    for mixer in target.recurrent:
        if isinstance(mixer, GatedDeltaNet):
            mixer.scan = chunked_deltanet_scan
        else:
            assert isinstance(mixer, Mamba2)
            mixer.scan = chunked_mamba_scan(mixer)
    assert check_row_invariance(target, 9) is not None
    tokens = probe_tokens(30, target.vocab_size, salt=5)
    whole = target.forward(target.new_state(), tokens, rows="all")
    state = target.new_state()
    parts = [target.forward(state, tokens[a:b], rows="all") for a, b in ((0, 6), (6, 30))]
    assert np.concatenate(parts).tobytes() != whole.tobytes()


def kv_only_truncate(state, length):
    """A rollback that cuts the tokens and the KV caches but leaves the recurrent state as the
    rejected drafts left it."""
    del state.tokens[length:]
    state.cache.truncate(length)
    state.trim_hidden(length)


def restoring_only_whole_passes(target):
    """A rollback that is exact when it cuts whole passes but cuts only the KV cache when it
    cuts into the last pass (a partly accepted window): the W-row check alone cannot see it."""
    exact, forward = target.truncate, target.forward

    def tracked_forward(state, tokens, rows="last"):
        state.pass_start = state.length
        return forward(state, tokens, rows)

    def truncate(state, length):
        if length <= getattr(state, "pass_start", 0):
            exact(state, length)
        else:
            kv_only_truncate(state, length)

    target.forward, target.truncate = tracked_forward, truncate


@pytest.mark.parametrize("variant", ["qwen3_5", "nemotron_h"])
def test_negative_control_a_kv_only_rollback_is_caught(variant, hybrid_checkpoints):
    target = fresh_target(hybrid_checkpoints, variant)
    target.truncate = kv_only_truncate
    assert check_row_invariance(target, 9) is not None
    target = fresh_target(hybrid_checkpoints, variant)
    restoring_only_whole_passes(target)
    verdict = check_row_invariance(target, 9)
    assert verdict is not None and "rolling a 9-row pass back" in verdict


def test_bad_configs_and_tensors_are_named(hybrid_checkpoints, tmp_path):
    import json
    import shutil

    from exactdraft.pretrained import load_checkpoint

    folder = tmp_path / "bad"
    shutil.copytree(hybrid_checkpoints["qwen3_5"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "layer_types": ["linear"]}))
    with pytest.raises(ConfigError, match="layer_types"):
        load_checkpoint(str(folder))
    (folder / "config.json").write_text(json.dumps({**config, "linear_num_value_heads": 8}))
    with pytest.raises(WeightError, match="in_proj"):
        from exactdraft.pretrained import build_target

        build_target(load_checkpoint(str(folder)), "torch")


@pytest.mark.parametrize("variant", ["qwen3_5_moe", "nemotron_h", "lfm2"])
def test_batched_rows_equal_each_sequence_alone(variant, hybrid_targets):
    """Sequences sharing passes (one joining late, one leaving early) keep their own
    recurrent states: every row has the bits of its sequence run alone."""
    from tests.models.test_batched import alone, passes, together

    target = hybrid_targets(variant)
    sequences = [passes(salt) for salt in range(3)]
    sequences[1] = sequences[1][:3]
    assert together(target, sequences) == [alone(target, s) for s in sequences]


@pytest.mark.parametrize("backend", ["torch-padded", "mlx"])
@pytest.mark.parametrize("variant", ["qwen3_moe", "qwen3_next", "nemotron_h", "lfm2"])
def test_other_backends_keep_parity_and_the_invariants(variant, backend, hybrid_checkpoints):
    """The guard's W-row and rollback checks, chunked prefill and logits parity on the padded
    torch backend and MLX's CPU backend."""
    from exactdraft.pretrained import build_target, load_checkpoint

    if backend == "mlx":
        pytest.importorskip("mlx.core", reason="mlx is not installed")
    target = build_target(load_checkpoint(hybrid_checkpoints[variant]), backend)
    assert check_row_invariance(target, 5) is None
    tokens = probe_tokens(40, target.vocab_size, salt=5)
    whole = target.forward(target.new_state(), tokens, rows="all")
    state = target.new_state()
    parts = [target.forward(state, tokens[a:b], rows="all") for a, b in ((0, 3), (3, 40))]
    assert np.concatenate(parts).tobytes() == whole.tobytes()
    assert relative_error(whole, hf_logits(hybrid_checkpoints[variant], tuple(tokens))) < 2e-5
