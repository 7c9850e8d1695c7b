"""DraftHead on the hybrid and mixture-of-experts families: train-drafter builds a head from a
HybridModel's features, and drafted == serial with it, bit for bit; negative control: the same
head on a backend whose multi-row passes are off by ulps writes other tokens (guard off)."""

from __future__ import annotations

import pytest

import exactdraft as xd
from exactdraft import DraftHead, SamplingParams
from exactdraft.drafters.head_model import HeadConfig
from tests.drafters.test_head import train_heads
from tests.exactness import ExactnessCheck

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [3, 17, 99, 3, 17, 99, 3, 17]]


@pytest.fixture(scope="module")
def hybrid_heads(hybrid_checkpoints, hybrid_targets, tmp_path_factory):
    """variant -> folder of a head trained for hybrid_targets(variant)."""
    return train_heads(hybrid_targets, hybrid_checkpoints, ("qwen3_next", "qwen3_moe"),
                       tmp_path_factory)


def compare(target, head, check: ExactnessCheck, serial: xd.Generator, label: str) -> None:
    for temperature in (0.0, 0.7, 1.2):
        for seed in range(2):
            params = SamplingParams(temperature=temperature, seed=seed, top_k=20 * seed)
            drafted = xd.Generator(target, head, adaptive_depth=False, guard=False)
            check.compare(drafted, PROMPTS[seed], 20, params, serial=serial, stop_tokens=[],
                          label=f"{label} t={temperature} seed {seed}")


@pytest.mark.parametrize("variant", ["qwen3_next", "qwen3_moe"])
def test_drafted_equals_serial_with_a_head_on_a_hybrid(hybrid_targets, hybrid_heads, variant):
    target = hybrid_targets(variant)
    head = DraftHead.from_pretrained(hybrid_heads[variant], target, max_draft=3)
    shape = target.head_shape
    config = HeadConfig.for_target(target, 16)
    assert (config.hidden_size, config.num_heads, config.head_dim) == \
        (shape.hidden_size, shape.num_heads, shape.head_dim)
    check = ExactnessCheck()
    compare(target, head, check, xd.Generator(target), variant)
    check.assert_exact(min_accepted=1)


def test_negative_control_the_head_on_an_inexact_hybrid(hybrid_checkpoints, hybrid_heads):
    import torch

    from exactdraft.pretrained import build_target, load_checkpoint
    from tests.inexact import InexactTorchBackend

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = build_target(load_checkpoint(hybrid_checkpoints["qwen3_next"]),
                              InexactTorchBackend())
        head = DraftHead.from_pretrained(hybrid_heads["qwen3_next"], target, max_draft=3)
        check = ExactnessCheck()
        compare(target, head, check, xd.Generator(target), "inexact")
    finally:
        torch.set_num_threads(threads)
    check.assert_caught()
