"""MTPDrafter: the multi-token-prediction layers a checkpoint ships propose the drafts.

Invariant: the drafter influences speed only. Its guesses are sampled with the target's
sampler, seed, parameters and history at their own positions (SAMPLER.md), as DraftModel's
are, and the verifier keeps a guess only if it equals the target's own sample. What it reads of
the target (the final hidden rows of committed positions, kept by the target state whose tokens
equal the committed sequence) changes no logit of the target.

How it drafts: the target state holds sequence[:-1] when a proposal is asked for. The head
first catches up on every committed position t it has not seen (the target's hidden row h_t
with the token after it, filling the head's own KV cache), and the last of those rows guesses
the token after the sequence; each further guess feeds the head's own output row back with the
guess just made, one position on. Before catching up the head's cache is cut back to the
committed positions, so its speculative rows never outlive a proposal. Depth is 1 to 3; with
`adaptive=True` it is cut to the drafts whose running chance of being kept (each given the
ones before it) stays above `min_acceptance`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exactdraft.drafters.base import DraftContext
from exactdraft.models.target import capabilities_of

MAX_DEPTH = 3
_DECAY = 0.9
_PRIOR_KEPT, _PRIOR_TRIED = 2.0, 2.5  # each draft kept 80% of the time until measured


class MTPDrafter:
    def __init__(self, target: Any, max_draft: int = MAX_DEPTH, adaptive: bool = True,
                 min_acceptance: float = 0.3) -> None:
        if isinstance(max_draft, bool) or not isinstance(max_draft, int) or \
                not 1 <= max_draft <= MAX_DEPTH:
            raise ValueError(f"max_draft must be an integer from 1 to {MAX_DEPTH}, got "
                             f"{max_draft!r}")
        if not isinstance(adaptive, bool):
            raise ValueError(f"adaptive must be True or False, got {adaptive!r}")
        if not 0.0 <= min_acceptance < 1.0:
            raise ValueError(f"min_acceptance must lie in [0, 1), got {min_acceptance!r}")
        head = target.mtp if capabilities_of(target).carries_mtp else None
        if head is None:
            raise ValueError(f"{target!r} has no multi-token-prediction layers (a checkpoint "
                             "with mtp.* tensors, such as Qwen3-Next or Qwen3.5, has them)")
        self.target = target
        self.head = head
        self.max_draft = max_draft
        self.adaptive = adaptive
        self.min_acceptance = min_acceptance
        target.keep_hidden = True
        self._context: DraftContext | None = None
        self._state: Any = None
        self._caught_up = 0  # head positions computed from the target's own hidden rows
        self.reset_statistics()

    def __repr__(self) -> str:
        return f"MTPDrafter(max_draft={self.max_draft}, adaptive={self.adaptive})"

    def reset_statistics(self) -> None:
        self._kept = [_PRIOR_KEPT] * MAX_DEPTH
        self._tried = [_PRIOR_TRIED] * MAX_DEPTH

    def depth(self) -> int:
        """How many drafts to propose now: max_draft, or fewer when adaptive."""
        if not self.adaptive:
            return self.max_draft
        depth, chance = 1, 1.0
        while depth < self.max_draft:
            chance *= self._kept[depth - 1] / self._tried[depth - 1]
            if chance * self._kept[depth] / self._tried[depth] < self.min_acceptance:
                break
            depth += 1
        return depth

    def begin(self, prompt: Sequence[int], context: DraftContext) -> None:
        self._context = context
        self._state = self.head.new_state()
        self._caught_up = 0
        self.reset_statistics()

    def propose(self, sequence: Sequence[int], limit: int) -> list[int]:
        limit = min(limit, self.depth(), self.target.max_context - len(sequence))
        context = self._context
        if limit <= 0 or context is None or len(sequence) < 2:
            return []
        end = len(sequence) - 1  # the target state holds sequence[:end]
        state = self.target.state_holding(sequence[:end])
        if state is None or self._caught_up >= end:
            return []
        self.head.truncate(self._state, self._caught_up)
        hidden = state.take_hidden(self._caught_up, end)
        if hidden is None:  # the rows are gone (the drafter joined late): start over
            self._state, self._caught_up = self.head.new_state(), 0
            hidden = state.take_hidden(0, end)
            if hidden is None:
                return []
        logits, carried = self.head.forward(self._state, sequence[self._caught_up + 1:],
                                            hidden)
        self._caught_up = end
        history = list(sequence)
        drafts: list[int] = []
        for step in range(limit):
            token = context.sampler.sample(logits[-1], context.params, pos=len(history),
                                           history=history, n_prompt=context.n_prompt)
            drafts.append(token)
            if step + 1 == limit:
                break
            history.append(token)
            logits, carried = self.head.forward(self._state, [token], carried[-1:], step + 1)
        return drafts

    def accepted(self, proposed: int, accepted: int) -> None:
        """Draft i was tested if the i before it were kept, and kept if accepted > i."""
        for i in range(min(proposed, MAX_DEPTH)):
            tested = accepted >= i
            self._tried[i] = self._tried[i] * _DECAY + tested
            self._kept[i] = self._kept[i] * _DECAY + (tested and accepted > i)
