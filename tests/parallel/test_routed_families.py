"""Tensor parallel for DeepSeek-V3 (latent attention, its matrices column-split) and GLM-4.5:
TP=2 writes TP=1's bits with rank r holding experts [r E/2, (r+1) E/2) of every MoE layer
whole (the negative control of adding the ranks' partial sums is tests/parallel/
test_experts.py's)."""

from __future__ import annotations

import pytest

from tests.models.families.test_deepseek_v3 import DEEPSEEK_V3, build_checkpoint
from tests.models.families.test_glm4_moe import GLM4_MOE
from tests.parallel.scenarios import same_bits
from tests.parallel.test_tensor_parallel import run_both


@pytest.mark.slow
@pytest.mark.parametrize("settings", [DEEPSEEK_V3, GLM4_MOE], ids=["deepseek_v3", "glm4_moe"])
def test_two_ranks_write_the_bits_of_one(settings, tmp_path):
    model = build_checkpoint(str(tmp_path / "model"), settings)
    runs = tmp_path / "runs"
    runs.mkdir()
    parallel, single, outcome = run_both(model, str(runs), control=False)
    # Layers 1 and 2 route (layer 0 is dense): rank 0 holds experts 0-3 of each.
    assert outcome["experts"] == [[0, 1, 2, 3]] * 2
    assert same_bits(parallel, single) == []
