"""DepthPolicy: verify as many drafts as pay off; never a change in tokens."""

from __future__ import annotations

import pytest

import exactdraft as xd
from exactdraft.depth import DepthPolicy, measure_pass_costs


def test_flat_costs_and_high_acceptance_draft_deep():
    policy = DepthPolicy([1.0] * 9)
    for _ in range(20):
        policy.record(8, 8)
    assert policy.acceptance > 0.9
    assert policy.depth(8) == 8
    assert policy.depth(3) == 3


def test_costly_passes_and_low_acceptance_stop_drafting_then_retry():
    policy = DepthPolicy([1.0 + 0.5 * w for w in range(9)])
    for _ in range(30):
        policy.record(4, 0)
    assert policy.depth(8) == 0
    for _ in range(60):  # passes without drafts drift back toward the prior
        policy.record(0, 0)
    assert policy.depth(8) >= 1


def test_depth_maximises_expected_tokens_per_second():
    costs = [1.0, 1.1, 1.2, 2.5, 2.6]
    policy = DepthPolicy(costs)
    a = policy.acceptance
    rates = [sum(a ** i for i in range(k + 1)) / costs[k] for k in range(5)]
    assert policy.depth(4) == rates.index(max(rates))


def test_bad_costs_are_refused():
    with pytest.raises(ValueError, match="positive"):
        DepthPolicy([1.0, 0.0])


def test_measured_costs_and_adaptive_generation_stay_exact(tiny_targets):
    target = tiny_targets["llama"]
    costs = measure_pass_costs(target, 5)
    assert len(costs) == 5 and min(costs) > 0
    adaptive = xd.Generator(target, xd.PromptLookup(min_match=1))
    fixed = xd.Generator(target, xd.PromptLookup(min_match=1), adaptive_depth=False)
    serial = xd.Generator(target)
    assert adaptive.depth_policy is not None and fixed.depth_policy is None
    for seed in range(5):
        params = xd.SamplingParams(temperature=0.8, seed=seed)
        prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
        expected = serial.generate(prompt, 30, params, stop_tokens=[]).tokens
        assert adaptive.generate(prompt, 30, params, stop_tokens=[]).tokens == expected
        assert fixed.generate(prompt, 30, params, stop_tokens=[]).tokens == expected
