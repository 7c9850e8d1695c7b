"""Whole experts per tensor-parallel rank: TP=2 writes TP=1's bits with rank r holding experts
[r E/2, (r+1) E/2) whole and every rank adding the gathered expert outputs in TP=1's order;
adding each rank's own experts first and all-reducing the partial sums gives other bits (the
negative control)."""

from __future__ import annotations

import pytest

from exactdraft.parallel.experts import expert_ranges
from tests.parallel.scenarios import same_bits
from tests.parallel.test_tensor_parallel import check_summed_control, run_both


def test_two_ranks_with_whole_experts_write_the_bits_of_one_and_summed_experts_do_not(
        tmp_path):
    from tests.conftest import build_tiny_checkpoint
    from tests.hybrid_checkpoints import HYBRID_VARIANTS

    # Every token takes all 4 experts, 2 on each rank: a sum of the ranks' partial sums
    # groups the four terms differently from TP=1's sum in expert order.
    settings = dict(HYBRID_VARIANTS["qwen3_moe"], num_experts_per_tok=4)
    model = build_tiny_checkpoint(str(tmp_path / "model"), "llama", **settings)
    runs = tmp_path / "runs"
    runs.mkdir()
    parallel, single, outcome = run_both(model, str(runs), control="experts")
    assert outcome["experts"] == [[0, 1]]  # rank 0 holds experts 0 and 1 of the MoE layer
    assert same_bits(parallel, single) == []
    check_summed_control(model, runs, single)


@pytest.mark.parametrize(("experts", "ranks", "ranges"), [
    (4, 2, [(0, 2), (2, 4)]), (8, 3, [(0, 2), (2, 5), (5, 8)]), (3, 3, [(0, 1), (1, 2), (2, 3)])])
def test_each_rank_holds_a_contiguous_range_of_whole_experts(experts, ranks, ranges):
    assert expert_ranges(experts, ranks) == ranges
