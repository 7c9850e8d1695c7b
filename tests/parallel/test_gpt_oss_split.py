"""gpt-oss at TP=2 writes TP=1's bits (every matrix split by output columns, attention with
sinks on every head on every rank), with two gloo ranks on 127.0.0.1."""

from __future__ import annotations

import pytest

from tests.models.families.test_gpt_oss import SETTINGS
from tests.parallel.scenarios import same_bits
from tests.parallel.test_tensor_parallel import run_both


@pytest.mark.slow
def test_two_ranks_write_the_bits_of_one(tmp_path):
    from tests.conftest import build_tiny_checkpoint

    model = build_tiny_checkpoint(str(tmp_path / "model"), "llama", **SETTINGS)
    runs = tmp_path / "runs"
    runs.mkdir()
    parallel, single, outcome = run_both(model, str(runs), control=False)
    # 2 ranks do not divide the 3 KV heads: every rank attends with every head.
    assert outcome["model"] == "DecoderModel" and outcome["kv_heads"] == 3
    assert same_bits(parallel, single) == []
    assert "tree" in single  # token trees, with each row's sink over its own path
