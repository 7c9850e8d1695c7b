"""FallbackDrafter: the first of several drafters that has a guess proposes it.

Invariant: like every drafter it influences speed only; it only chooses, per pass, which of
its drafters' proposals reaches the verifier, and every child sees the same committed
sequence, features and feedback it would see drafting alone (feedback goes to the child
whose drafts were verified).

Why: a copy drafter (PromptLookup) is nearly free and long-sighted where the text repeats
and silent elsewhere, a trained head (DraftHead) guesses a few tokens of any text at a cost
per depth. Trying the copy first and the head where it has nothing gets the copy's long
accepted runs on edits and the head's on chat. Their acceptance differs, so each child is a
`source` the Generator keeps a depth policy for: the depth asked of the head is not set by
the copy drafter's record, nor the other way round.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exactdraft.drafters.base import DraftContext, Drafter, DraftTree, traits_of
from exactdraft.errors import ParameterError


def _cut(proposal: list[int] | DraftTree, limit: int) -> list[int] | DraftTree:
    """The first `limit` guesses (a tree lists parents before children, so its first nodes
    are a tree too)."""
    if isinstance(proposal, DraftTree):
        if len(proposal) <= limit:
            return proposal
        return DraftTree(proposal.tokens[:limit], proposal.parents[:limit])
    return list(proposal[:limit])


class FallbackDrafter:
    """`FallbackDrafter(PromptLookup(), head)`: each pass's drafts come from the first drafter
    (in the order given) that proposes any; the last is asked only when none before it has
    a proposal. Its max_draft is the largest of its drafters' (each is asked for at most its
    own), it wants the target's features when any drafter does (they reach those that want
    them), and it proposes trees when any drafter does."""

    def __init__(self, *drafters: Drafter) -> None:
        if len(drafters) < 2:
            raise ParameterError(f"FallbackDrafter needs at least two drafters, got "
                                 f"{len(drafters)}")
        for index, drafter in enumerate(drafters):
            missing = [name for name in ("max_draft", "begin", "propose", "accepted")
                       if not hasattr(drafter, name)]
            if missing:
                raise ParameterError(f"FallbackDrafter drafter {index} ({type(drafter).__name__})"
                                     f" is not a Drafter: it has no {', '.join(missing)}")
        traits = [traits_of(drafter) for drafter in drafters]
        vocabularies = {each.vocab_size for each in traits if each.vocab_size is not None}
        if len(vocabularies) > 1:
            raise ParameterError(f"FallbackDrafter drafters draft different vocabularies: "
                                 f"{sorted(vocabularies)}")
        if vocabularies:
            self.vocab_size = vocabularies.pop()
        self.drafters = tuple(drafters)
        self.max_draft = max(drafter.max_draft for drafter in drafters)
        self.tree_width = max(each.tree_width for each in traits)
        self.wants_features = any(each.wants_features for each in traits)
        # The sequence the last `source` call looked at, which drafter will propose after it
        # and that drafter's proposal at its own max_draft (None for the last drafter).
        self._asked: tuple[tuple[int, ...], int, Any] | None = None
        self._proposer = 0  # the drafter whose drafts the last verified pass held

    def __repr__(self) -> str:
        return f"FallbackDrafter({', '.join(repr(drafter) for drafter in self.drafters)})"

    @property
    def copies_per_sequence(self) -> bool:
        """Copyable per sequence when every drafter in it is."""
        return all(traits_of(drafter).copies_per_sequence for drafter in self.drafters)

    @property
    def sources(self) -> int:
        return len(self.drafters)

    def begin(self, prompt: Sequence[int], context: DraftContext) -> None:
        self._asked = None
        for drafter in self.drafters:
            drafter.begin(prompt, context)

    def observe(self, features: Any, start: int) -> None:
        for drafter in self.drafters:
            if traits_of(drafter).wants_features:
                drafter.observe(features, start)

    def source(self, sequence: Sequence[int]) -> int:
        """Which drafter proposes after `sequence`: the first whose proposal is not empty (the
        proposal is kept for `propose`)."""
        key = tuple(sequence)  # the Generator's own tuple when it asks: no copy
        if self._asked is not None and (self._asked[0] is key or self._asked[0] == key):
            return self._asked[1]
        for index, drafter in enumerate(self.drafters[:-1]):
            proposal = drafter.propose(key, drafter.max_draft)
            if len(proposal):
                self._asked = (key, index, proposal)
                return index
        self._asked = (key, len(self.drafters) - 1, None)
        return len(self.drafters) - 1

    def propose(self, sequence: Sequence[int], limit: int) -> list[int] | DraftTree:
        index = self.source(sequence)
        self._proposer = index
        drafter, kept = self.drafters[index], self._asked[2]
        limit = min(limit, drafter.max_draft)
        if kept is None:
            return drafter.propose(self._asked[0], limit)
        return _cut(kept, limit)

    def accepted(self, proposed: int, accepted: int) -> None:
        self.drafters[self._proposer].accepted(proposed, accepted)
