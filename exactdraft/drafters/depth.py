"""How many drafts to verify per pass, and which nodes of a token tree: measured pass costs
against running acceptance.

Invariant: the policy only bounds which drafts go into a verify pass, so it changes speed and
never tokens. It picks the depth k that maximises the expected committed tokens per second,
E(k) / cost(k + 1), where a pass of W rows costs what was measured on the loaded model and
E(k) = 1 + a + ... + a^k is the expected number of tokens a pass commits when each draft is
kept with probability a (the running acceptance, estimated per generation with a prior that
favours trying drafts). The drafter's own time counts too: proposing k drafts costs k times its
running seconds per draft depth (a trained head runs a step per depth; a lookup costs about
nothing), so a drafter slower than what its drafts save is asked for fewer, or none.

Trees generalise it (so the tree's width per depth adapts as its depth does): a_r is the
running rate at which a node listed r-th among its siblings is kept when its parent was kept
and its earlier siblings were not. A node's value, the chance that it is kept, is its parent's
value times (1 - a_0) ... (1 - a_(r-1)) a_r; E of a subtree is 1 + the sum of its nodes'
values, and the kept subtree grows best node first (a node only after its parent and its
earlier siblings, so ranks stay what the drafter listed), to the size with the best
E / cost(k + 1). A chain is the tree whose every node is a first child.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from typing import Any

from exactdraft.drafters.base import DraftTree
from exactdraft.guard import probe_tokens

# Evidence older than a few dozen passes fades, so the depth follows the text being written.
_DECAY = 0.95
# Priors (kept, rejected) of a first child and of a later sibling: both favour trying.
_PRIORS = ((2.0, 1.0), (1.0, 1.0))
# Sibling ranks tracked apart; later ones share the last rate.
_RANKS = 4
# A rank the passes do not test drifts back toward its prior at 1 - _DECAY per pass where a
# failed probe (one draft: its extra row and the drafter's time) costs at most a tenth of a
# pass, and proportionally slower where it costs more: where extra rows are dear (an AVX2-only
# CPU), a drafter that stopped paying is retried less often, and its failed retries cost no
# larger share of the time than where rows are cheap.
_PROBE_SHARE = 0.1 * (1 - _DECAY)


def measure_pass_costs(target: Any, widths: int, rounds: int = 3) -> list[float]:
    """Seconds for a W-row pass, W = 1..widths, at a short context: the best of `rounds`
    rounds that each time every width once, so a burst of load on a shared host lands on one
    round's figures and not on every figure of one width. A pass of W rows does no more work
    than one of more rows, so each figure is then capped by those of the wider passes: a
    width that only met a burst does not look dearer than the widths above it."""
    prefix = probe_tokens(32, target.vocab_size, salt=5)
    window = probe_tokens(widths, target.vocab_size, salt=6)
    state = target.new_state()
    target.forward(state, prefix)
    costs = [float("inf")] * widths
    for _ in range(rounds):
        for width in range(1, widths + 1):
            started = time.perf_counter()
            target.forward(state, window[:width], rows="all")
            costs[width - 1] = min(costs[width - 1], time.perf_counter() - started)
            target.truncate(state, len(prefix))
    for width in range(widths - 2, -1, -1):
        costs[width] = min(costs[width], costs[width + 1])
    return costs


def _children(tree: DraftTree) -> dict[int, list[int]]:
    """Each parent's children (-1: the root's), in listing order."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents):
        children.setdefault(parent, []).append(node)
    return children


class DepthPolicy:
    """`pass_costs[i]`: seconds of an (i + 1)-row pass. With `learn_pass_costs` the passes a
    generation runs replace them as they are timed (running figures per width; widths not yet
    run scale with the one-row pass), so the costs follow the context length the generation
    has reached: a long context makes each extra row's attention dearer."""

    def __init__(self, pass_costs: Sequence[float], learn_pass_costs: bool = False) -> None:
        if not pass_costs or min(pass_costs) <= 0:
            raise ValueError(f"pass costs must be positive, got {list(pass_costs)}")
        self.measured_costs = list(pass_costs)
        self.learn_pass_costs = learn_pass_costs
        self.timed: list[float] = [0.0] * len(pass_costs)  # running seconds per width, 0: none
        self.draft_cost = 0.0  # running seconds the drafter takes per depth it proposes
        self.reset()

    def fresh(self) -> DepthPolicy:
        """A policy for a new generation: these costs and settings, no evidence."""
        return DepthPolicy(self.measured_costs, self.learn_pass_costs)

    @property
    def pass_costs(self) -> list[float]:
        """Seconds per pass width as the policy weighs them now."""
        if not any(self.timed):
            return self.measured_costs
        scale = self.timed[0] / self.measured_costs[0] if self.timed[0] else 1.0
        return [timed or measured * scale
                for timed, measured in zip(self.timed, self.measured_costs)]

    def record_pass_time(self, rows: int, seconds: float) -> None:
        """A pass of `rows` rows took `seconds` (ignored unless learn_pass_costs)."""
        if not self.learn_pass_costs or not 1 <= rows <= len(self.timed) or seconds <= 0:
            return
        old = self.timed[rows - 1]
        self.timed[rows - 1] = old * _DECAY + seconds * (1 - _DECAY) if old else seconds

    def reset(self) -> None:
        # [rank] -> running (kept, rejected) of nodes listed rank-th among their siblings
        self.counts = [list(_PRIORS[min(rank, 1)]) for rank in range(_RANKS)]

    @property
    def acceptance(self) -> float:
        """The running rate at which a first child (a chain's draft) is kept."""
        return self.rate(0)

    def rate(self, rank: int) -> float:
        kept, rejected = self.counts[min(rank, _RANKS - 1)]
        return kept / (kept + rejected)

    def _drift(self) -> float:
        """How fast an untested rank drifts back toward its prior (_PROBE_SHARE says why)."""
        costs = self.pass_costs
        if len(costs) < 2:
            return 1 - _DECAY
        probe = (costs[1] - costs[0] + self.draft_cost) / costs[0]
        return min(1 - _DECAY, _PROBE_SHARE / probe) if probe > 0 else 1 - _DECAY

    def _update(self, seen: dict[int, Sequence[int]]) -> None:
        """One pass's evidence per rank, (kept, rejected); a rank the pass did not test drifts
        back toward its prior, so a policy that stopped drafting tries again later (the dearer
        a failed probe, the later)."""
        drift = self._drift()
        for rank, counts in enumerate(self.counts):
            kept, rejected = seen.get(rank, _PRIORS[min(rank, 1)])
            weight = 1.0 if rank in seen else drift
            counts[0] = counts[0] * _DECAY + kept * weight
            counts[1] = counts[1] * _DECAY + rejected * weight

    def record_draft_time(self, seconds: float, depth: int) -> None:
        """A proposal `depth` drafts deep (a chain's length, a tree's depth) took `seconds`."""
        if depth > 0 and seconds >= 0:
            self.draft_cost = self.draft_cost * _DECAY + (seconds / depth) * (1 - _DECAY) \
                if self.draft_cost else seconds / depth

    def record(self, proposed: int, accepted: int) -> None:
        """A pass verified a chain of `proposed` drafts and kept the first `accepted`. A pass
        without drafts lets the drafter's measured cost fade, so a drafter that once looked
        too slow is asked again later."""
        self._update({0: (accepted, 1 if accepted < proposed else 0)} if proposed else {})
        if not proposed:
            self.draft_cost *= _DECAY

    def record_tree(self, tree: DraftTree, kept: list[int]) -> None:
        """A pass verified `tree` and kept the nodes `kept` (a path from the root): each node
        whose parent was kept and whose earlier siblings were not is evidence for its rank."""
        on_path = {-1, *kept}
        seen: dict[int, list[int]] = {}
        for parent, children in _children(tree).items():
            if parent not in on_path:
                continue
            for rank, node in enumerate(children):
                counts = seen.setdefault(min(rank, _RANKS - 1), [0, 0])
                if node in on_path:
                    counts[0] += 1
                    break
                counts[1] += 1
        self._update(seen)

    def select(self, tree: DraftTree, limit: int) -> DraftTree:
        """The subtree of at most `limit` nodes with the most expected tokens per second:
        nodes are taken best first among those whose parent and earlier siblings are taken
        (so every node keeps its rank), and the count with the best E / cost is kept."""
        values: list[float] = []
        # parent -> (children so far, the chance that all of them miss)
        siblings: dict[int, tuple[int, float]] = {}
        for parent in tree.parents:
            rank, missed = siblings.get(parent, (0, 1.0))
            rate = self.rate(rank)
            values.append(missed * rate * (1.0 if parent < 0 else values[parent]))
            siblings[parent] = (rank + 1, missed * (1.0 - rate))
        children = _children(tree)
        next_sibling = {node: group[i + 1] for group in children.values()
                        for i, node in enumerate(group[:-1])}
        ready = [(-values[node], node) for node in children.get(-1, [])[:1]]
        taken: list[int] = []
        costs = self.pass_costs
        best_count, best_rate, expected = 0, 1.0 / costs[0], 1.0
        while ready and len(taken) < min(limit, len(costs) - 1):
            value, node = heapq.heappop(ready)
            taken.append(node)
            expected -= value
            rate = expected / costs[len(taken)]
            if rate > best_rate:
                best_count, best_rate = len(taken), rate
            for follower in (children.get(node, [None])[0], next_sibling.get(node)):
                if follower is not None:
                    heapq.heappush(ready, (-values[follower], follower))
        chosen = sorted(taken[:best_count])
        index = {node: i for i, node in enumerate(chosen)}
        return DraftTree(tuple(tree.tokens[node] for node in chosen),
                         tuple(index.get(tree.parents[node], -1) for node in chosen))

    def depth(self, limit: int, drafting: bool = True) -> int:
        """The number of drafts (0..limit) with the most expected tokens per second, counting
        the drafter's time to propose them (not with `drafting=False`: drafts already made)."""
        a = self.acceptance
        per_draft = self.draft_cost if drafting else 0.0
        best_depth, best_rate, expected = 0, 0.0, 0.0
        costs = self.pass_costs
        for k in range(min(limit, len(costs) - 1) + 1):
            expected += a ** k
            rate = expected / (costs[k] + k * per_draft)
            if rate > best_rate:
                best_depth, best_rate = k, rate
        return best_depth
