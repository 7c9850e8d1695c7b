"""LFM2 under tensor parallel: TP=2 writes TP=1's bits (logits of chains, a batch and
rollbacks; tokens of serial, drafted and batched runs) with its attention split by heads and
its short convolutions run whole on every rank from their gathered projections (the family's
split, models/families/lfm2.py); a row-parallel MLP down projection gives other bits (the
negative control)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.parallel.scenarios import same_bits
from tests.parallel.test_tensor_parallel import check_summed_control, run_both


@pytest.mark.slow
def test_two_ranks_write_the_bits_of_one(tmp_path):
    from tests.conftest import build_tiny_checkpoint
    from tests.hybrid_checkpoints import HYBRID_VARIANTS

    # 4 query heads on 2 KV heads (the shared tiny lfm2 has 1, which 2 ranks cannot split).
    settings = dict(HYBRID_VARIANTS["lfm2"], hidden_size=64, num_attention_heads=4,
                    num_key_value_heads=2)
    model = build_tiny_checkpoint(str(tmp_path / "model"), "llama", **settings)
    runs = tmp_path / "runs"
    runs.mkdir()
    parallel, single, outcome = run_both(model, str(runs), control=True)
    assert outcome["kv_heads"] == 1  # a KV head per rank (attention_heads.py)
    # Every rank holds each convolution's whole state: the last 2 inputs of its 64 channels.
    assert outcome["recurrent"] == [[[2, 64]]] * 2
    assert same_bits(parallel, single) == []
    drafted, accepted = parallel["drafts_lookup"]
    assert drafted > accepted
    assert np.array_equal(parallel["tokens_self_drafted"], parallel["tokens_serial"])
    # Negative control: all-reducing partial down projections changes the logits' bits.
    check_summed_control(model, runs, single)
