"""How many drafts to verify per pass: measured pass costs against running acceptance.

Invariant: the policy only bounds how many drafts go into a verify pass, so it changes speed
and never tokens. It picks the depth k that maximises the expected committed tokens per second,
E(k) / cost(k + 1), where a pass of W rows costs what was measured on the loaded model and
E(k) = 1 + a + ... + a^k is the expected number of tokens a pass commits when each draft is
kept with probability a (the running acceptance, estimated per generation with a prior that
favours trying drafts).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from exactdraft.guard import probe_tokens

# Evidence older than a few dozen passes fades, so the depth follows the text being written.
_DECAY = 0.95
_PRIOR_KEPT, _PRIOR_REJECTED = 2.0, 1.0


def measure_pass_costs(target: Any, widths: int, repeats: int = 2) -> list[float]:
    """Seconds for a W-row pass, W = 1..widths (best of `repeats`), at a short context."""
    prefix = probe_tokens(32, target.vocab_size, salt=5)
    window = probe_tokens(widths, target.vocab_size, salt=6)
    state = target.new_state()
    target.forward(state, prefix)
    costs = []
    for width in range(1, widths + 1):
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            target.forward(state, window[:width], rows="all")
            best = min(best, time.perf_counter() - started)
            target.truncate(state, len(prefix))
        costs.append(best)
    return costs


class DepthPolicy:
    def __init__(self, pass_costs: Sequence[float]) -> None:
        if not pass_costs or min(pass_costs) <= 0:
            raise ValueError(f"pass costs must be positive, got {list(pass_costs)}")
        self.pass_costs = list(pass_costs)
        self.reset()

    def reset(self) -> None:
        self.kept, self.rejected = _PRIOR_KEPT, _PRIOR_REJECTED

    @property
    def acceptance(self) -> float:
        return self.kept / (self.kept + self.rejected)

    def record(self, proposed: int, accepted: int) -> None:
        """A pass verified `proposed` drafts and kept the first `accepted` of them; a pass
        without drafts lets the estimate drift back toward the prior, so a policy that stopped
        drafting tries again later."""
        if proposed == 0:
            self.kept = self.kept * _DECAY + _PRIOR_KEPT * (1 - _DECAY)
            self.rejected = self.rejected * _DECAY + _PRIOR_REJECTED * (1 - _DECAY)
            return
        self.kept = self.kept * _DECAY + accepted
        self.rejected = self.rejected * _DECAY + (1 if accepted < proposed else 0)

    def depth(self, limit: int) -> int:
        """The number of drafts (0..limit) with the most expected tokens per second."""
        a = self.acceptance
        best_depth, best_rate, expected = 0, 0.0, 0.0
        for k in range(min(limit, len(self.pass_costs) - 1) + 1):
            expected += a ** k
            rate = expected / self.pass_costs[k]
            if rate > best_rate:
                best_depth, best_rate = k, rate
        return best_depth
