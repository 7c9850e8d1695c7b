"""DepthPolicy: verify as many drafts as pay off; never a change in tokens."""

from __future__ import annotations

import random

import pytest

import exactdraft as xd
from exactdraft.drafters import depth as depth_module
from exactdraft.drafters.base import DraftTree
from exactdraft.drafters.depth import DepthPolicy, measure_pass_costs
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
    for _ in range(150):  # passes without drafts drift back toward the prior
        policy.record(0, 0)
    assert policy.depth(8) >= 1


def wasted_share(extra_row: float, passes: int = 2000) -> tuple[float, int]:
    """(the share of the time spent on failed drafts, how many passes drafted) for a drafter
    whose every draft is rejected, where each row past the first costs `extra_row` of a pass."""
    costs = [1.0 + extra_row * w for w in range(9)]
    policy, wasted, probes = DepthPolicy(costs), 0.0, 0
    for _ in range(passes):
        depth = policy.depth(8)
        if depth:
            wasted += costs[depth] - costs[0]
            probes += 1
        policy.record(depth, 0)
    return wasted / passes, probes


@pytest.mark.parametrize("extra_row", [0.37, 0.5])
def test_dear_rows_make_retries_rarer(extra_row, monkeypatch):
    """Where an extra row costs 0.37 of a pass (an AVX2-only CPU) a drafter that never pays is
    still retried, but its retries cost under 2.5% of the time; negative control: with the
    drift of cheap rows at every cost they cost more than 3%."""
    share, probes = wasted_share(extra_row)
    assert probes > 10 and share < 0.025
    monkeypatch.setattr(depth_module, "_PROBE_SHARE", 1e9)
    assert wasted_share(extra_row)[0] > 0.03


def test_depth_maximises_expected_tokens_per_second():
    costs = [1.0, 1.1, 1.2, 2.5, 2.6]
    policy = DepthPolicy(costs)
    a = policy.acceptance
    rates = [sum(a ** i for i in range(k + 1)) / costs[k] for k in range(5)]
    assert policy.depth(4) == rates.index(max(rates))


def test_a_slow_drafter_is_asked_for_fewer_drafts_then_none_then_again():
    """The drafter's own time per draft counts against what its drafts save: a slow drafter
    gets shallower chains, one slower than a pass gets none (drafts already made are still
    verified as deep as the passes alone say), and its cost fades while it is not asked."""
    policy = DepthPolicy([1.0 + 0.05 * w for w in range(9)])
    for _ in range(20):
        policy.record(8, 6)
    assert policy.depth(8) == 8
    policy.record_draft_time(0.8, 4)  # 0.2 per draft
    shallow = policy.depth(8)
    assert 0 < shallow < 8
    policy.record_draft_time(0.0, 0)  # no drafts proposed: no evidence
    assert policy.depth(8) == shallow
    for _ in range(40):
        policy.record_draft_time(20.0, 4)
    assert policy.depth(8) == 0 and policy.depth(8, drafting=False) == 8
    for _ in range(200):  # passes without drafts
        policy.record(0, 0)
    assert policy.depth(8) >= 1


def test_learned_pass_costs_follow_the_timed_passes():
    """With learn_pass_costs, timed passes replace the load-time costs of their width, and
    widths not yet timed scale with the one-row pass; without it the costs stay; a fresh
    policy keeps the settings and none of the timings."""
    policy = DepthPolicy([1.0, 1.1, 1.2, 1.3], learn_pass_costs=True)
    policy.record_pass_time(1, 2.0)
    assert policy.pass_costs == [2.0, 2.2, 2.4, 2.6]
    policy.record_pass_time(2, 3.0)
    assert policy.pass_costs == [2.0, 3.0, 2.4, 2.6]
    for _ in range(100):
        policy.record_pass_time(2, 5.0)
    assert 4.9 < policy.pass_costs[1] < 5.0
    policy.record_pass_time(9, 1.0)  # wider than the costs go: ignored
    fresh = policy.fresh()
    assert fresh.learn_pass_costs and fresh.pass_costs == [1.0, 1.1, 1.2, 1.3]
    fixed = DepthPolicy([1.0, 1.1])
    fixed.record_pass_time(1, 7.0)
    assert fixed.pass_costs == [1.0, 1.1]


def test_dearer_rows_at_a_long_context_mean_shallower_drafts():
    """Extra rows that cost more than measured at load (long contexts) lower the depth."""
    policy = DepthPolicy([1.0 + 0.02 * w for w in range(9)], learn_pass_costs=True)
    for _ in range(20):
        policy.record(8, 1)
    cheap = policy.depth(8)
    for rows in range(1, 10):
        policy.record_pass_time(rows, 1.0 + 0.6 * (rows - 1))
    assert policy.depth(8) < cheap


class SlowDrafter:
    """Proposes the next token of a fixed list after sleeping far longer than a pass costs."""

    max_draft = 4

    def __init__(self, expected, prompt_length) -> None:
        self.expected, self.prompt_length, self.proposals = expected, prompt_length, 0

    def begin(self, prompt, context) -> None:
        pass

    def propose(self, sequence, limit):
        import time

        self.proposals += 1
        time.sleep(0.02)
        done = len(sequence) - self.prompt_length
        return list(self.expected[done:done + limit])

    def accepted(self, proposed, accepted) -> None:
        pass


def test_generation_stops_asking_a_drafter_slower_than_its_drafts_save(tiny_targets):
    """Pass costs fixed at about a millisecond, a drafter that takes 20 ms to propose drafts
    the target always keeps: the adaptive run stops asking it after its first measured
    proposals; a fixed-depth run asks it every pass. Both write the serial tokens."""
    target, prompt = tiny_targets["llama"], [5, 6, 7, 8, 5, 6]
    serial = xd.Generator(target).generate(prompt, 24, temperature=0.0, stop_tokens=[])
    proposals = {}
    for adaptive in (True, False):
        drafter = SlowDrafter(serial.tokens, len(prompt))
        generator = xd.Generator(target, drafter, adaptive_depth=adaptive)
        if adaptive:
            generator.depth_policy = DepthPolicy([0.001 + 0.0001 * w for w in range(9)])
        drafted = generator.generate(prompt, 24, temperature=0.0, stop_tokens=[])
        assert drafted.tokens == serial.tokens
        proposals[adaptive] = drafter.proposals
    assert proposals[True] <= 3 < proposals[False], proposals


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


class _ScriptedTarget:
    """Passes whose seconds a script gives (a clock that only these passes move)."""

    vocab_size = 100

    def __init__(self, seconds):
        self.seconds, self.clock, self.calls = seconds, 0.0, []

    def new_state(self):
        return None

    def truncate(self, state, length):
        pass

    def forward(self, state, tokens, rows="last"):
        if rows == "all":
            self.calls.append(len(tokens))
            self.clock += self.seconds(len(self.calls), len(tokens))


def test_measured_costs_shrug_off_a_burst_and_stay_monotone(monkeypatch):
    """A burst of load in one round does not raise a width's figure (another round timed it
    quietly), and a width timed dearer than a wider pass is capped at the wider pass's."""
    clean = {1: 1.0, 2: 1.25, 3: 1.125, 4: 1.5}  # width 2 dearer than 3 in every round

    def seconds(call, width):
        return clean[width] + (4.0 if call == 4 else 0.0)  # the first round's width 4

    target = _ScriptedTarget(seconds)
    monkeypatch.setattr(depth_module.time, "perf_counter", lambda: target.clock)
    costs = measure_pass_costs(target, 4)
    assert target.calls == [1, 2, 3, 4] * 3  # rounds of every width, not one width at a time
    assert costs == [1.0, 1.125, 1.125, 1.5]
    # Negative control: one round only, and the burst is the widest pass's figure.
    target = _ScriptedTarget(seconds)
    monkeypatch.setattr(depth_module.time, "perf_counter", lambda: target.clock)
    assert measure_pass_costs(target, 4, rounds=1) == [1.0, 1.125, 1.125, 5.5]


def test_negative_control_adaptive_generation(inexact_targets):
    """The same comparison fails on a backend whose multi-row passes are off by ulps."""
    adaptive_and_fixed(inexact_targets(), False).assert_caught()


# -- token trees -----------------------------------------------------------------------------

# Two candidates per depth, the first listed the drafter's favourite: node 2 d is the first
# child at depth d, node 2 d + 1 its sibling; both hang from the first child above.
WIDE = DraftTree(tuple(range(100, 108)), (-1, -1, 0, 0, 2, 2, 4, 4))


def first_children_win(policy: DepthPolicy, passes: int) -> None:
    for _ in range(passes):
        policy.record_tree(WIDE, [0, 2, 4, 6])


def second_children_win(policy: DepthPolicy, passes: int) -> None:
    """The sibling is kept where the first child was not (a path 1: node 1 ends it)."""
    for _ in range(passes):
        policy.record_tree(WIDE, [1])


def test_siblings_that_never_win_are_dropped():
    policy = DepthPolicy([1.0 + 0.05 * w for w in range(9)])
    assert not policy.select(WIDE, 8).is_chain  # the prior tries siblings
    for _ in range(20):  # the first child wins every other pass; a sibling never does
        first_children_win(policy, 1)
        policy.record_tree(WIDE, [])
    assert 0.3 < policy.rate(0) < 0.9 and policy.rate(1) < 0.2
    chosen = policy.select(WIDE, 8)
    assert chosen.is_chain and list(chosen.tokens) == WIDE.first_path()[:len(chosen)]
    assert len(chosen) >= 1


def test_a_first_child_that_always_wins_needs_no_sibling():
    policy = DepthPolicy([1.0 + 0.05 * w for w in range(9)])
    first_children_win(policy, 40)
    assert policy.rate(0) > 0.9
    assert list(policy.select(WIDE, 8).tokens) == WIDE.first_path()


def test_negative_control_siblings_that_win_are_kept():
    policy = DepthPolicy([1.0 + 0.05 * w for w in range(9)])
    second_children_win(policy, 40)
    assert policy.rate(1) > 0.9
    chosen = policy.select(WIDE, 8)
    assert 101 in chosen.tokens and not chosen.is_chain


def test_costly_passes_keep_fewer_nodes():
    cheap, costly = DepthPolicy([1.0] * 9), DepthPolicy([1.0 + 0.6 * w for w in range(9)])
    for policy in (cheap, costly):
        first_children_win(policy, 3)
    assert len(costly.select(WIDE, 8)) < len(cheap.select(WIDE, 8)) == 8


def paths(tree: DraftTree) -> set[tuple[int, ...]]:
    """Every node's tokens from the root."""
    out: list[tuple[int, ...]] = []
    for token, parent in zip(tree.tokens, tree.parents):
        out.append((() if parent < 0 else out[parent]) + (token,))
    return set(out)


@pytest.mark.parametrize("seed", range(20))
def test_selection_is_a_subtree_within_the_limit(seed):
    rng = random.Random(seed)
    parents: list[int] = []
    for node in range(rng.randrange(1, 15)):
        parents.append(rng.randrange(-1, node))
    tree = DraftTree(tuple(rng.sample(range(1000), len(parents))), tuple(parents))
    policy = DepthPolicy([1.0 + rng.random() * 0.2 * w for w in range(12)])
    for _ in range(rng.randrange(10)):
        policy.record_tree(tree, [])
    limit = rng.randrange(0, 12)
    chosen = policy.select(tree, limit)
    assert len(chosen) <= limit
    assert paths(chosen) <= paths(tree)


def test_a_chain_is_selected_as_deep_as_depth_says():
    chain = DraftTree.chain(list(range(10, 18)))
    for costs in ([1.0, 1.1, 1.2, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0], [1.0 + 0.3 * w for w in range(9)]):
        policy = DepthPolicy(costs)
        for passes in range(4):
            policy.record(8, passes)
            assert len(policy.select(chain, 8)) == policy.depth(8)
