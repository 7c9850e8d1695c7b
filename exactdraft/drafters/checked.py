"""CheckedDrafter: a drafter's proposals, made safe to verify whatever the drafter does.

Invariant: a drafter can cost at most the pass it misbehaves in. Whatever `begin`, `propose`,
`source` or `accepted` does (raise, return ids outside the vocabulary, non-integers, more
tokens than asked), the Generator receives a valid draft (possibly empty) and the run
continues with the tokens serial decoding writes: drafts only ever change how many passes a
run takes. Each misbehaviour is counted by kind in DrafterFaults, named after the drafter,
and the first of each kind in a generation is reported once as a RuntimeWarning. A DraftTree
reaches the Generator only when trees can be verified (`trees`); otherwise its first path
does, as a chain.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from exactdraft.drafters.base import DraftContext, Drafter, DraftTree, traits_of

# The kinds of misbehaviour, as counted in DrafterFaults.counts.
RAISED = "raised"
OUT_OF_VOCABULARY = "out_of_vocabulary"
NOT_A_TOKEN = "not_a_token"
TOO_MANY = "too_many"
NOT_A_SEQUENCE = "not_a_sequence"
NOT_A_SOURCE = "not_a_source"


@dataclass
class DrafterFaults:
    """How often the drafter misbehaved in one generation, by kind; empty when it behaved."""

    drafter: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    first_message: dict[str, str] = field(default_factory=dict)

    def add(self, kind: str, message: str) -> None:
        if kind not in self.counts:
            self.first_message[kind] = message
            warnings.warn(f"drafter {self.drafter} misbehaved ({kind}): {message}; what it "
                          f"proposed in that pass was dropped, the output is unchanged",
                          RuntimeWarning, stacklevel=4)
        self.counts[kind] = self.counts.get(kind, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __bool__(self) -> bool:
        return bool(self.counts)


def describe(drafter: Any) -> str:
    try:
        text = repr(drafter)
    except Exception:  # a drafter's repr is its own code too
        text = type(drafter).__name__
    return text if len(text) <= 80 else text[:77] + "..."


class CheckedDrafter:
    """One generation's view of a drafter: calls it and keeps only what can be verified."""

    def __init__(self, drafter: Drafter, vocab_size: int, max_draft: int,
                 trees: bool = False) -> None:
        self.drafter = drafter
        self.trees = trees
        self.vocab_size = vocab_size
        self.faults = DrafterFaults(drafter=describe(drafter))
        self.working = True  # False after `begin` raised: no drafts for this generation
        self.max_draft = max_draft  # the guard proved windows up to max_draft + 1 rows
        # A drafter that reads the target's features (DraftHead) says so; it then gets the
        # final hidden rows of the committed positions through `observe`.
        traits = traits_of(drafter)
        self.wants_features = traits.wants_features
        # A drafter that chooses among several proposers (FallbackDrafter) declares how many
        # `sources` it has and says through `source(sequence)` which one proposes next.
        self.sources = traits.sources

    def begin(self, prompt: Sequence[int], context: DraftContext) -> None:
        try:
            self.drafter.begin(prompt, context)
        except Exception as error:
            self.working = False
            self.faults.add(RAISED, f"begin() raised {type(error).__name__}: {error}")

    def propose(self, sequence: Sequence[int], limit: int) -> list[int] | DraftTree:
        """At most `limit` in-vocabulary token ids: the longest valid prefix of a chain, or of
        a tree the nodes whose path is valid. `limit` never exceeds the drafter's max_draft,
        the widest window the guard proved."""
        limit = min(limit, self.max_draft)
        if not self.working or limit <= 0:
            return []
        try:
            proposal = self.drafter.propose(sequence, limit)
            if isinstance(proposal, DraftTree):
                tree = self._valid_tree(proposal, limit)
                if self.trees and not tree.is_chain:
                    return tree
                proposal = tree.first_path()
            drafts = self._valid_prefix(proposal, limit)
        except Exception as error:
            self.faults.add(RAISED, f"propose() raised {type(error).__name__}: {error}")
            return []
        return drafts

    def _valid_tree(self, tree: DraftTree, limit: int) -> DraftTree:
        """The tree without its bad nodes and their descendants, cut to `limit` nodes."""
        if len(tree) > limit:
            self.faults.add(TOO_MANY, f"propose() returned a tree of {len(tree)} nodes, more "
                                      f"than the {limit} asked for")
        index: dict[int, int] = {-1: -1}  # the drafter's node -> its place in the kept tree
        tokens: list[int] = []
        parents: list[int] = []
        for node, (value, parent) in enumerate(zip(tree.tokens, tree.parents)):
            if len(tokens) == limit:
                break
            if parent not in index:
                continue  # below a dropped node
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                self.faults.add(NOT_A_TOKEN, f"propose() returned {describe(value)} "
                                             f"({type(value).__name__}) at tree node {node}")
                continue
            if not 0 <= int(value) < self.vocab_size:
                self.faults.add(OUT_OF_VOCABULARY, f"propose() returned token id {int(value)} "
                                                   f"at tree node {node}, outside the "
                                                   f"vocabulary [0, {self.vocab_size})")
                continue
            index[node] = len(tokens)
            tokens.append(int(value))
            parents.append(index[parent])
        return DraftTree(tuple(tokens), tuple(parents))

    def _valid_prefix(self, proposal: Any, limit: int) -> list[int]:
        # A chain is verified in order, so a bad token makes the drafts after it unusable too.
        if isinstance(proposal, (str, bytes)) or not hasattr(proposal, "__iter__"):
            self.faults.add(NOT_A_SEQUENCE, f"propose() returned {type(proposal).__name__} "
                                            f"{describe(proposal)}, not a list of token ids")
            return []
        drafts: list[int] = []
        for value in proposal:
            if len(drafts) == limit:
                self.faults.add(TOO_MANY, f"propose() returned more than the {limit} tokens "
                                          "asked for")
                break
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                self.faults.add(NOT_A_TOKEN, f"propose() returned {describe(value)} "
                                             f"({type(value).__name__}), not a token id")
                break
            token = int(value)
            if not 0 <= token < self.vocab_size:
                self.faults.add(OUT_OF_VOCABULARY, f"propose() returned token id {token}, "
                                                   f"outside the vocabulary "
                                                   f"[0, {self.vocab_size})")
                break
            drafts.append(token)
        return drafts

    def source(self, sequence: Sequence[int]) -> int:
        """Which of the drafter's sources proposes after `sequence` (0 for a drafter of one
        source, or when the drafter misbehaves)."""
        if self.sources == 1 or not self.working:
            return 0
        try:
            index = self.drafter.source(sequence)
        except Exception as error:
            self.faults.add(RAISED, f"source() raised {type(error).__name__}: {error}")
            return 0
        if isinstance(index, bool) or not isinstance(index, int) or \
                not 0 <= index < self.sources:
            self.faults.add(NOT_A_SOURCE, f"source() returned {describe(index)}, not one of "
                                          f"its {self.sources} sources")
            return 0
        return index

    def accepted(self, proposed: int, accepted: int) -> None:
        try:
            self.drafter.accepted(proposed, accepted)
        except Exception as error:
            self.faults.add(RAISED, f"accepted() raised {type(error).__name__}: {error}")

    def observe(self, features: Any, start: int) -> None:
        """Hand a drafter that wants them the target's features of committed positions
        start, start + 1, ... (one row each)."""
        if not self.working or not self.wants_features:
            return
        try:
            self.drafter.observe(features, start)
        except Exception as error:
            self.faults.add(RAISED, f"observe() raised {type(error).__name__}: {error}")
