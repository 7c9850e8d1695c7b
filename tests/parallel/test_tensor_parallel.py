"""TP=2 writes TP=1's bits: logits (chains, batches, trees, imported prefixes) and tokens
(serial, drafted, batched in the Engine), with two gloo ranks on 127.0.0.1; the row-parallel
split that sums partial products gives other bits (the negative control)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from exactdraft.parallel import ParallelSettings, launch
from tests.conftest import build_tiny_checkpoint, needs_smollm2
from tests.parallel.scenarios import PREFIX, read_outcome, same_bits, scenario, scenario_rank

SETTINGS = ParallelSettings(2, timeout_s=60, heartbeat_s=0.25, stale_s=3)


def run_both(model: str, folder: str, control: bool | str, heads: bool = False,
             settings: ParallelSettings = SETTINGS) -> tuple[dict, dict, dict]:
    """(TP=N rank 0's scenario, TP=1's, rank 0's outcome: which model class ran, its KV heads
    and recurrent state shapes, the experts it holds), after checking every rank ended
    cleanly."""
    import exactdraft as xd

    ranks = settings.world_size
    codes = launch(scenario_rank, ranks, (model, settings, folder, control, heads),
                   timeout_s=600)
    outcomes = [read_outcome(folder, r) for r in range(ranks)]
    assert codes == [0] * ranks and all(o.get("ok") for o in outcomes), (codes, outcomes)
    # The other ranks followed rank 0 and exited when it closed.
    assert all(o.get("followed") for o in outcomes[1:])
    with np.load(os.path.join(folder, "tp.npz")) as saved:
        parallel = {name: saved[name] for name in saved.files}
    single = scenario(xd.Generator.from_pretrained(model, guard=heads), heads)
    return parallel, single, outcomes[0]


def check_summed_control(model: str, runs, single: dict) -> None:
    """The negative control's logits (row_parallel.npy: partial products summed across ranks)
    differ in bits from TP=1's, which the single run matches, while staying the same model."""
    from exactdraft.pretrained import build_target, load_checkpoint

    target = build_target(load_checkpoint(model), "torch")
    exact = target.forward(target.new_state(), PREFIX, rows="all")
    assert exact.tobytes() == single["prefill"].tobytes()
    summed = np.load(str(runs / "row_parallel.npy"))
    assert summed.tobytes() != exact.tobytes()
    assert np.abs(summed - exact).max() < 1e-3 * np.abs(exact).max()  # the same model


def test_two_ranks_write_the_bits_of_one_and_a_row_parallel_split_does_not(tmp_path):
    model = build_tiny_checkpoint(str(tmp_path / "model"), "llama", intermediate_size=128)
    runs = tmp_path / "runs"
    runs.mkdir()
    parallel, single, outcome = run_both(model, str(runs), control=True)
    # 2 ranks divide the 2 KV heads: attention split by heads, a KV head per rank.
    assert outcome["model"] == "HeadSplitDecoderModel" and outcome["kv_heads"] == 1
    assert same_bits(parallel, single) == []
    assert len(single["tokens_serial"]) == 20 and len(single["tokens_engine0"]) == 12
    # Negative control: summing partial products across ranks changes bits of the logits.
    check_summed_control(model, runs, single)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["llama-tied", "mistral", "qwen2", "qwen3", "gemma3"])
def test_two_ranks_write_the_bits_of_one_in_every_dense_family(tmp_path, variant):
    model = build_tiny_checkpoint(str(tmp_path / "model"), variant)
    runs = tmp_path / "runs"
    runs.mkdir()
    parallel, single, outcome = run_both(model, str(runs), control=False)
    assert outcome["model"] == "HeadSplitDecoderModel"
    assert same_bits(parallel, single) == []


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["qwen3_moe", "mixtral"])
def test_two_ranks_write_the_bits_of_one_with_experts(tmp_path, variant):
    from tests.hybrid_checkpoints import build_hybrid_checkpoint

    model = build_hybrid_checkpoint(str(tmp_path / "model"), variant)
    runs = tmp_path / "runs"
    runs.mkdir()
    parallel, single, outcome = run_both(model, str(runs), control=False)
    assert outcome["experts"] and all(held == [0, 1] for held in outcome["experts"])
    assert same_bits(parallel, single) == []
    assert "after_chain" in single  # no token trees on this family: chains instead


@pytest.mark.slow
@needs_smollm2
def test_two_ranks_write_the_bits_of_one_on_smollm2(tmp_path):
    from exactdraft.pretrained import bundled_model_path

    # With the load-time guard and the bundled draft head (features, token trees) as well.
    parallel, single, outcome = run_both(bundled_model_path(), str(tmp_path), control=False,
                                         heads=True)
    # 2 ranks do not divide SmolLM2's 3 KV heads: every rank attends with every head.
    assert outcome["model"] == "DecoderModel" and outcome["kv_heads"] == 3
    assert same_bits(parallel, single) == []
    assert "tokens_head2" in single
