"""DraftModel: a smaller Target with the same vocabulary guesses with the keyed rule.

Invariant: the draft model's cache only ever holds a prefix of the committed sequence followed
by its own latest guesses; before each proposal it is cut back to the longest prefix it shares
with the committed sequence, so it stays in step with what the target kept. Its guesses are
sampled with the target's sampler, seed, parameters and history at their own positions
(SAMPLER.md), so where the two models agree the shared noise makes the guesses agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exactdraft.drafters.base import DraftContext
from exactdraft.models.target import Target


class DraftModel:
    def __init__(self, model: Target, max_draft: int = 4) -> None:
        if isinstance(max_draft, bool) or not isinstance(max_draft, int) or max_draft < 1:
            raise ValueError(f"max_draft must be an integer >= 1, got {max_draft!r}")
        self.model = model
        self.max_draft = max_draft
        self.vocab_size = model.vocab_size
        self._context: DraftContext | None = None
        self._state: Any = None
        self._cached: list[int] = []

    def __repr__(self) -> str:
        return f"DraftModel({type(self.model).__name__}, max_draft={self.max_draft})"

    @classmethod
    def from_pretrained(cls, path_or_id: str, max_draft: int = 4,
                        **load_options: Any) -> DraftModel:
        """Load a draft model the way Generator.from_pretrained loads a target."""
        from exactdraft.pretrained import load_target

        return cls(load_target(path_or_id, **load_options), max_draft=max_draft)

    def begin(self, prompt: Sequence[int], context: DraftContext) -> None:
        self._context = context
        if self._state is None:
            self._state = self.model.new_state()
        # The cache may be reused across generations: it is cut to the shared prefix below.

    def propose(self, sequence: Sequence[int], limit: int) -> list[int]:
        limit = min(limit, self.max_draft, self.model.max_context - len(sequence))
        if limit <= 0 or self._context is None:
            return []
        shared = 0
        usable = min(len(self._cached), len(sequence) - 1)
        while shared < usable and self._cached[shared] == sequence[shared]:
            shared += 1
        self.model.truncate(self._state, shared)
        context = self._context
        history = list(sequence)
        feed = history[shared:]
        drafts: list[int] = []
        try:
            while True:
                logits = self.model.forward(self._state, feed, rows="last")
                token = context.sampler.sample(logits[-1], context.params, pos=len(history),
                                               history=history, n_prompt=context.n_prompt)
                drafts.append(token)
                if len(drafts) == limit:
                    break
                history.append(token)
                feed = [token]
        except BaseException:
            self._cached = []
            self.model.truncate(self._state, 0)
            raise
        self._cached = history
        return drafts

    def accepted(self, proposed: int, accepted: int) -> None:
        pass
