"""DepthPolicy: verify as many drafts as pay off; never a change in tokens."""

from __future__ import annotations

import pytest

import exactdraft as xd
from exactdraft.depth import DepthPolicy, measure_pass_costs
from tests.exactness import ExactnessCheck, OracleDrafter


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


def adaptive_and_fixed(target, guard) -> ExactnessCheck:
    """Adaptive and fixed-depth drafting against serial runs, row by row. The drafts are the
    serial run's tokens with one in five made wrong, so the policy sees real acceptance."""
    serial = xd.Generator(target)
    check = ExactnessCheck()
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    kept = {True: 0, False: 0}
    for seed in range(5):
        params = xd.SamplingParams(temperature=0.8, seed=seed)
        expected = serial.generate(prompt, 30, params, stop_tokens=[]).tokens
        for adaptive in (True, False):
            generator = xd.Generator(target, OracleDrafter(expected, 8, 0.2, seed),
                                     adaptive_depth=adaptive, guard=guard)
            assert (generator.depth_policy is not None) == adaptive
            drafted, _ = check.compare(generator, prompt, 30, params, serial=serial,
                                       stop_tokens=[], label=f"adaptive={adaptive} seed {seed}")
            kept[adaptive] += drafted.stats.accepted
    assert kept[True] > 0 and kept[False] > 0, kept  # both kinds of run kept drafts
    return check


def test_measured_costs_and_adaptive_generation_stay_exact(tiny_targets):
    target = tiny_targets["llama"]
    costs = measure_pass_costs(target, 5)
    assert len(costs) == 5 and min(costs) > 0
    adaptive_and_fixed(target, True).assert_exact()


def test_negative_control_adaptive_generation(inexact_targets):
    """The same comparison fails on a backend whose multi-row passes are off by ulps."""
    adaptive_and_fixed(inexact_targets(), False).assert_caught()
