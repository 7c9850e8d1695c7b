"""The Drafter protocol: anything that guesses the next tokens of a sequence.

Invariant: a drafter influences speed only. Whatever it proposes, the Verifier keeps a draft
only when it equals the target's own sample, so a drafter may be wrong, slow to adapt or
stateful without any effect on the tokens a generation writes.
"""

from __future__ import annotations

import heapq
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from exactdraft.sampling.keyed import KeyedSampler
from exactdraft.sampling.params import SamplingParams


@dataclass(frozen=True)
class DraftTree:
    """Several guesses verified in one pass: node i guesses `tokens[i]` right after node
    `parents[i]`, or right after the committed sequence when parents[i] is -1. Parents come
    before their children. Siblings are alternatives: the verifier keeps the deepest path whose
    every node equals the target's own sample, so at most one sibling can be kept."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"a DraftTree needs one parent per token, got {len(self.parents)} "
                             f"parents for {len(self.tokens)} tokens")
        for node, parent in enumerate(self.parents):
            if not -1 <= parent < node:
                raise ValueError(f"DraftTree node {node}: parent must be -1 or an earlier node, "
                                 f"got {parent!r}")

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> DraftTree:
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(parent == node - 1 for node, parent in enumerate(self.parents))

    def first_path(self) -> list[int]:
        """The tokens of the path that takes the first-listed child at every depth (the
        drafter's favourite), for targets that verify chains only."""
        path, at = [], -1
        for node, parent in enumerate(self.parents):
            if parent == at:
                path.append(self.tokens[node])
                at = node
        return path

    @classmethod
    def from_continuations(cls, continuations: list[list[int]], nodes: int,
                           min_probability: float = 0.0, width: int = 1) -> DraftTree:
        """The most probable `nodes` nodes of the continuations' trie, at most `width` children
        each, a node's probability being (continuations through it) / (all continuations), kept
        while >= min_probability. Nodes are listed most probable first, so a node's first child is
        its most frequent continuation and the tree's first path follows the most frequent branch
        (among equals, the first listed continuation: the most recent)."""
        total = len(continuations)
        tokens: list[int] = []
        parents: list[int] = []
        # Candidates: (-count, order, parent node, depth, continuations through it).
        candidates: list[tuple[int, int, int, int, list[list[int]]]] = []
        order = 0

        def offer(parent: int, depth: int, alive: list[list[int]]) -> None:
            nonlocal order
            groups: dict[int, list[list[int]]] = {}
            for continuation in alive:
                if len(continuation) > depth:
                    groups.setdefault(continuation[depth], []).append(continuation)
            for group in sorted(groups.values(), key=lambda group: -len(group))[:width]:
                heapq.heappush(candidates, (-len(group), order, parent, depth, group))
                order += 1

        offer(-1, 0, continuations)
        while candidates and len(tokens) < nodes:
            count, _, parent, depth, group = heapq.heappop(candidates)
            if -count / total < min_probability:
                break
            tokens.append(group[0][depth])
            parents.append(parent)
            offer(len(tokens) - 1, depth + 1, group)
        return cls(tuple(tokens), tuple(parents))

    def depth(self) -> int:
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return max(depths, default=0)


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may use to guess like the target: the generation's sampling setup."""

    params: SamplingParams
    sampler: KeyedSampler
    n_prompt: int


@dataclass(frozen=True)
class DrafterTraits:
    """What a drafter may declare beyond the required members, with the defaults of a drafter
    that declares nothing (attributes of the same names on the drafter; `traits_of` reads
    them, and nothing else does):

    - `tree_width`: 1, chains only; more: it may propose DraftTrees;
    - `wants_features`: False; True: `observe(rows, start)` receives the target's final hidden
      rows of the committed positions;
    - `sources`: 1, one depth policy; more (with `source(sequence)`): it chooses among that
      many proposers, each with its own policy;
    - `vocab_size`: None, the target's; else the vocabulary it drafts in, which must be the
      target's;
    - `copies_per_sequence`: False, the engine shares one instance among sequences in turn;
      True, its state is plain data and each sequence drafts with its own copy.
    """

    tree_width: int = 1
    wants_features: bool = False
    sources: int = 1
    vocab_size: int | None = None
    copies_per_sequence: bool = False


def traits_of(drafter: Any) -> DrafterTraits:
    """The drafter's declarations, each a default where it declares none or declares a value of
    the wrong kind (a drafter can cost at most speed: drafters/checked.py)."""
    defaults = DrafterTraits()

    def count(name: str) -> Any:
        value = getattr(drafter, name, None)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1:
            return int(value)
        return getattr(defaults, name)

    return DrafterTraits(
        tree_width=count("tree_width"),
        wants_features=getattr(drafter, "wants_features", False) is True,
        sources=count("sources") if hasattr(drafter, "source") else 1,
        vocab_size=count("vocab_size"),
        copies_per_sequence=getattr(drafter, "copies_per_sequence", False) is True)


@runtime_checkable
class Drafter(Protocol):
    """Required: max_draft, begin, propose, accepted. Optional declarations: DrafterTraits
    (read through `traits_of`, with their defaults)."""

    max_draft: int

    def begin(self, prompt: Sequence[int], context: DraftContext) -> None:
        """Start a new generation for this prompt."""

    def propose(self, sequence: Sequence[int], limit: int) -> list[int] | DraftTree:
        """Up to `limit` guesses for the tokens after `sequence` (prompt plus committed
        output): a chain (a list) or a DraftTree of at most `limit` nodes; an empty list means
        a plain serial step."""

    def accepted(self, proposed: int, accepted: int) -> None:
        """Feedback after verification: `accepted` of the `proposed` drafts were kept."""
