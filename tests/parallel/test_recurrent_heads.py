"""The hybrid recurrent families under tensor parallel: TP=2 writes TP=1's bits (logits of
chains, a batch and rollbacks; tokens of serial, drafted and batched runs) with each rank
running and holding only its own heads of every recurrent layer (Gated DeltaNet, Mamba-2) and
attention layer; summing the heads' partial out projections across the ranks gives other bits
(the negative control)."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.models.gated_deltanet import GatedDeltaNet
from exactdraft.models.mamba2 import Mamba2
from exactdraft.parallel.recurrent_heads import (
    deltanet_ranges,
    deltanet_splits,
    mamba_ranges,
    mamba_splits,
    split_deltanet,
    split_mamba,
)
from tests.parallel.scenarios import same_bits
from tests.parallel.test_tensor_parallel import check_summed_control, run_both

# (variant, the rank's recurrent state shapes at TP=2: (conv state, recurrent state) per layer)
HYBRIDS = {
    # Gated DeltaNet: 2 key heads of 16, 4 value heads of 16, kernel 4, in two layers.
    "qwen3_next": [[[3, 64], [16, 2, 16]]] * 2,
    # Mamba-2: 4 heads of 16, 2 groups of state 16, kernel 4, in two layers.
    "nemotron_h": [[[3, 64], [16, 2, 16]]] * 2,
}


@pytest.mark.parametrize("variant", list(HYBRIDS))
def test_two_ranks_write_the_bits_of_one_with_the_recurrence_split_by_heads(tmp_path,
                                                                              variant):
    from tests.hybrid_checkpoints import build_hybrid_checkpoint

    model = build_hybrid_checkpoint(str(tmp_path / "model"), variant)
    runs = tmp_path / "runs"
    runs.mkdir()
    parallel, single, outcome = run_both(model, str(runs), control="recurrent")
    # Rank 0 holds half of every recurrent layer's state: its heads' channels and states.
    assert outcome["recurrent"] == HYBRIDS[variant]
    assert outcome["kv_heads"] == 1  # its attention layers' KV head (attention_heads.py)
    # Its mixture-of-experts layers hold experts 0 and 1 of 4 whole (experts.py).
    assert outcome["experts"] and all(held == [0, 1] for held in outcome["experts"])
    assert same_bits(parallel, single) == []
    # Drafted runs write the serial run's tokens, rolling back every rank's state where a
    # draft is rejected.
    drafted, accepted = parallel["drafts_lookup"]
    assert drafted > accepted
    assert np.array_equal(single["tokens_lookup"], single["tokens_serial"])
    assert np.array_equal(parallel["tokens_self_drafted"], parallel["tokens_serial"])
    # Negative control: all-reducing partial out projections changes the logits' bits.
    check_summed_control(model, runs, single)


def deltanet(key_heads: int, value_heads: int) -> GatedDeltaNet:
    conv = np.zeros((4, 2 * key_heads * 8 + value_heads * 8), np.float32)
    return GatedDeltaNet(FakeShard(), FakeShard(), conv,
                         np.ones(value_heads), np.ones(value_heads), np.ones(8, np.float32),
                         key_heads, value_heads, 8, 8, 1e-6, 0)


def mamba(heads: int, groups: int) -> Mamba2:
    conv = np.zeros((4, heads * 8 + 2 * groups * 8), np.float32)
    return Mamba2(FakeShard(), FakeShard(), conv, None,
                  np.ones(heads), np.ones(heads), np.ones(heads, np.float32),
                  np.ones(heads * 8, np.float32), heads, 8, groups, 8, 0.0, 1.0, 1e-6, 0)


@pytest.mark.parametrize(("key_heads", "value_heads", "ranks", "splits"), [
    (2, 4, 2, True),   # a key head and its two value heads per rank
    (2, 4, 4, True),   # one value head per rank, within one key head's group
    (1, 4, 2, True),   # one key head read by every rank
    (2, 6, 4, False),  # 6 value heads do not split 4 ways
    (3, 6, 2, False),  # a rank's 3 value heads would straddle a key head's group
])
def test_a_deltanet_is_split_only_where_every_rank_holds_whole_heads(key_heads, value_heads,
                                                                     ranks, splits):
    layer = deltanet(key_heads, value_heads)
    assert deltanet_splits(layer, ranks) is splits
    if not splits:
        return
    group = value_heads // key_heads
    owned = []
    for r in range(ranks):
        rows, conv, (v0, v1) = deltanet_ranges(layer, r, ranks)
        part = split_deltanet(layer, r, ranks, FakeShard())
        # The local layer maps its value heads to the key heads the whole layer does.
        local_group = part.num_value_heads // part.num_key_heads
        assert [(v0 + h) // group - v0 // group for h in range(v1 - v0)] == \
            [h // local_group for h in range(part.num_value_heads)]
        assert part.conv_channels == part.conv_weight.shape[1] == sum(b - a for a, b in conv)
        assert sum(b - a for a, b in rows) == part.conv_channels + part.num_value_heads * 10
        owned += [i for a, b in rows[2:] for i in range(a, b)]  # v, z, b, a: the value heads'
    # The value heads' rows of the ranks cover the layer's once.
    assert sorted(owned) == list(range(2 * key_heads * 8, layer.conv_channels + value_heads * 10))


@pytest.mark.parametrize(("heads", "groups", "ranks", "splits"), [
    (4, 2, 2, True), (8, 4, 4, True), (4, 1, 2, False), (6, 2, 4, False)])
def test_a_mamba_layer_is_split_only_where_every_rank_holds_whole_norm_groups(heads, groups,
                                                                             ranks, splits):
    layer = mamba(heads, groups)
    assert mamba_splits(layer, ranks) is splits
    if not splits:
        return
    owned = []
    for r in range(ranks):
        rows = mamba_ranges(layer, r, ranks)[0]
        part = split_mamba(layer, r, ranks, FakeShard())
        assert part.conv_channels == part.conv_weight.shape[1]
        assert sum(b - a for a, b in rows) == part.inner + part.conv_channels + part.num_heads
        owned += [i for a, b in rows for i in range(a, b)]
    # Every projected row is owned by exactly one rank.
    assert sorted(owned) == list(range(2 * heads * 8 + 2 * groups * 8 + heads))


class FakeShard:
    """Stands for a column-split projection: only its shape is read."""

    shape = (0, 64)


@pytest.mark.slow
def test_a_checkpoint_with_mtp_layers_runs_split_without_them(tmp_path):
    from tests.hybrid_checkpoints import build_hybrid_checkpoint, mtp_copy

    # Qwen3.5 as shipped carries MTP layers; TP does not keep them (no MTP drafting there),
    # and its embedding scaled up makes drafts both kept and rejected (rollbacks).
    plain = build_hybrid_checkpoint(str(tmp_path / "plain"), "qwen3_5")
    model = mtp_copy(plain, str(tmp_path / "model"))
    runs = tmp_path / "runs"
    runs.mkdir()
    parallel, single, outcome = run_both(model, str(runs), control=False)
    assert outcome["recurrent"] == [[[3, 64], [16, 2, 16]]]
    assert same_bits(parallel, single) == []


@pytest.mark.slow
def test_a_mamba_layer_whose_norm_group_spans_the_ranks_runs_whole_on_every_rank(tmp_path):
    from tests.conftest import build_tiny_checkpoint
    from tests.hybrid_checkpoints import HYBRID_VARIANTS

    # One norm group over all 4 heads: every rank runs the whole recurrence (same bits).
    model = build_tiny_checkpoint(str(tmp_path / "model"), "llama",
                                  **dict(HYBRID_VARIANTS["nemotron_h"], n_groups=1))
    runs = tmp_path / "runs"
    runs.mkdir()
    parallel, single, outcome = run_both(model, str(runs), control=False)
    assert outcome["recurrent"] == [[[3, 96], [16, 4, 16]]] * 2
    assert same_bits(parallel, single) == []


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(HYBRIDS))
def test_two_ranks_write_the_bits_of_one_from_a_q8_0_gguf_file(tmp_path, variant):
    from exactdraft.pretrained import load_checkpoint
    from tests.hybrid_checkpoints import build_hybrid_checkpoint
    from tests.loading.test_gguf_families import CONVERTERS

    folder = build_hybrid_checkpoint(str(tmp_path / "model"), variant)
    path = CONVERTERS[variant](folder, str(tmp_path / "model.gguf"), True)
    kept = load_checkpoint(path, with_tokenizer=False).metadata["tensor_types"]
    assert kept.get("Q8_0", 0) > 0  # the rank's rows are taken from quantized blocks
    runs = tmp_path / "runs"
    runs.mkdir()
    parallel, single, outcome = run_both(path, str(runs), control=False)
    assert outcome["recurrent"] == HYBRIDS[variant]
    assert same_bits(parallel, single) == []


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "recurrent"), [
    # One value head per rank, within its key head's group; its key head's q, k rows.
    ("qwen3_next", [[[3, 48], [16, 1, 16]]] * 2),
    # 2 norm groups do not split 4 ways: every rank runs the whole Mamba-2 layers.
    ("nemotron_h", [[[3, 128], [16, 4, 16]]] * 2),
])
def test_four_ranks_write_the_bits_of_one(tmp_path, variant, recurrent):
    from exactdraft.parallel import ParallelSettings
    from tests.hybrid_checkpoints import build_hybrid_checkpoint

    model = build_hybrid_checkpoint(str(tmp_path / "model"), variant)
    runs = tmp_path / "runs"
    runs.mkdir()
    settings = ParallelSettings(4, timeout_s=120, heartbeat_s=0.25, stale_s=5)
    parallel, single, outcome = run_both(model, str(runs), control=False, settings=settings)
    assert outcome["recurrent"] == recurrent
    assert outcome["kv_heads"] == 2  # 4 ranks do not divide 2 KV heads: every head, every rank
    assert outcome["experts"] and all(held == [0] for held in outcome["experts"])
    assert same_bits(parallel, single) == []
