"""One generation, advanced one target pass at a time, and what it produces.

Invariant: Decoding commits exactly the tokens serial decoding writes, whatever the passes that
carry it look like: one sequence per pass or many (the engine), prompt chunks of any size, a
prompt prefix already in the state (a cached prefix), drafts or none. Every committed token is
the target's keyed sample from its own row (drafts are kept only when the verifier finds them
equal to it), and every stop condition (stop token, stop string, max_new_tokens, context) is
checked token by token on committed tokens, so a run stops at the very token where the serial
run stops. Logprobs are computed from the same rows and histories as the tokens.

Features: when the drafter declares `wants_features` (DraftHead), `wants_features` is true
and the pass should also return the final hidden rows it appended (a Pass with
features=True); `advance(logits, features)` then hands the drafter, through
`drafter.observe(rows, start)`, the rows of the positions the state keeps (the prompt's once
the drafter has begun, then each pass's committed positions). They feed the drafter only: a
pass run without them (the engine's) just leaves such a drafter with nothing to draft from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from exactdraft.constraints.rows import ConstraintRows
from exactdraft.drafters.base import DraftContext, Drafter, DraftTree
from exactdraft.drafters.checked import CheckedDrafter
from exactdraft.drafters.depth import DepthPolicy
from exactdraft.models.target import PassSequence, Target, capabilities_of
from exactdraft.results import Chunk, GenerationResult, GenerationStats, Run
from exactdraft.sampling.keyed import KeyedSampler, TokenLogprob
from exactdraft.verify import Verdict, Verifier, tree_rows

# The results live in exactdraft.results; these names stay importable from here.
__all__ = ["Chunk", "Decoding", "DecodingSetup", "GenerationResult", "GenerationStats", "Run"]


@dataclass
class DecodingSetup:
    """What every generation of one Generator shares: the parts, and what its load-time guard
    decided. The Generator builds one per generation (Generator.decoding_setup), the engine
    one per sample; Decoding reads nothing else of the Generator."""

    target: Target
    verifier: Verifier
    sampler: KeyedSampler
    prefill_chunk: int
    drafter: Drafter | None = None
    drafting_note: str | None = None  # why drafting is off although a drafter is given
    max_draft: int = 0
    trees: bool = False  # drafts may be token trees (the guard proved tree passes)
    depth_policy: DepthPolicy | None = None  # holds the measured pass costs
    forced_window: int = 0  # most forced tokens one pass may verify (0: none)

    @property
    def drafting_enabled(self) -> bool:
        return self.drafter is not None and self.drafting_note is None


class RunSource(Protocol):
    """What the Engine reads of a Generator: it turns a request into a checked Run, holds the
    parts a Decoding needs, and is locked while a pass runs on its target."""

    target: Target
    drafter: Drafter | None
    prefill_chunk: int
    lock: Any  # held while a pass runs on `target`

    def prepare(self, prompt: Any, max_new_tokens: int | None = None, sampling: Any = None, *,
                where: str = "generate", **options: Any) -> Run: ...

    def decoding_setup(self, run: Run) -> DecodingSetup: ...


class Decoding:
    """One generation advanced one target pass at a time: the loop body that Generator runs
    for one sequence and the engine runs for many sequences sharing passes.

    A step is `tokens = decoding.plan(...)`, one target pass holding `decoding.part()` (the
    tokens appended to `decoding.state`, with their tree parents when the drafts are a tree)
    with rows `decoding.rows`, run through models.target.run_pass alone or beside other
    sequences, then `decoding.advance(logits, features)`, which decides
    and commits what that pass holds and returns the step's chunk (None after a prompt chunk
    that is not the last). A plan with no tokens (max_new_tokens 0) needs no pass: advance(None).
    The prompt's first `state.length` positions may already be in the state (a cached prefix);
    that changes no bit (chunked prefill equals one-pass prefill). Whatever `plan` is allowed
    (prompt tokens per pass, drafts or none), the committed tokens are the same."""

    def __init__(self, setup: DecodingSetup, run: Run, stream_text: bool,
                 state: Any = None, drafter: Drafter | None = None,
                 timed_passes: bool = True) -> None:
        target = self.target = setup.target
        self.run, self.stream_text = run, stream_text
        self.verifier, self.sampler = setup.verifier, setup.sampler
        self.prefill_chunk = setup.prefill_chunk
        # A constraint: its mask is the verifier's row transform (exactdraft.constraints.rows).
        self.constraint = None if run.matcher is None else \
            ConstraintRows(run.matcher, len(run.prompt_ids))
        self.transform = self.constraint
        # Forced tokens are drafts too: only in runs that draft, in passes the guard proved.
        self.forced_window = setup.forced_window if run.use_drafts else 0
        # Under a constraint drafts are chains (each cut to what the constraint allows).
        self.trees = setup.trees and self.constraint is None
        self.state = target.new_state() if state is None else state
        self.cursor = self.state.length  # prompt positions in the state
        self.sequence = list(run.prompt_ids)
        use = run.use_drafts and setup.drafting_enabled
        self.drafter = CheckedDrafter(drafter or setup.drafter, target.vocab_size,
                                      setup.max_draft, setup.trees) if use else None
        stats = run.stats
        stats.drafting = self.drafter is not None
        if self.drafter is not None:
            stats.drafter_faults = self.drafter.faults
        stats.drafting_note = setup.drafting_note if run.use_drafts else None
        # A policy per generation, as if reset: the Generator's holds the measured costs.
        self.policy = setup.depth_policy.fresh() \
            if self.drafter is not None and setup.depth_policy is not None else None
        # A drafter of several sources (FallbackDrafter) gets a policy per source: each
        # source's acceptance and time set the depth asked of it.
        self.policies = [self.policy] + [self.policy.fresh() for _ in
                                         range(self.drafter.sources - 1)] \
            if self.policy is not None else []
        self.planned: list[int] = []  # the tokens of the pass being run
        self.drafts: list[int] = []  # the drafts among them
        self.tree: DraftTree | None = None  # the drafts' tree, when they are one
        self.parents: list[int] | None = None  # the tree's parents (draft indices), for a tree
        self.finished = False
        self._proposed = False  # whether the drafter has proposed in this generation
        self._draft_seconds = 0.0  # the last proposal's time
        # Whether the time from plan to advance is this sequence's pass (not in a shared one).
        self.timed_passes = timed_passes
        self._prompt_features: list[np.ndarray] = []  # until the drafter begins
        # Timings cover this sequence's passes only, not the time a consumer holds a chunk.
        self._clock = self._started = 0.0

    @property
    def prefilling(self) -> bool:
        return self.cursor < len(self.run.prompt_ids)

    @property
    def rows(self) -> str:
        return "all" if self.drafts else "last"

    @property
    def wants_features(self) -> bool:
        """Whether the next pass should return its features for the drafter (the drafter
        wants them and the target declares `returns_features`)."""
        return self.drafter is not None and self.drafter.wants_features and \
            capabilities_of(self.target).returns_features

    def plan(self, max_tokens: int | None = None, drafts: bool = True) -> list[int]:
        """The tokens the next pass appends: a prompt chunk (at most `max_tokens`) while
        prefilling, else the last committed token and the drafts (none if not `drafts`): the
        tokens a constraint forces where it forces some, else the drafter's. Where the setup
        allows trees the drafts may be a token tree (`tree` is then set). `part()` describes
        the pass this sequence needs."""
        run, sequence = self.run, self.sequence
        self._clock = time.perf_counter()
        self.drafts, self.tree, self.forced = [], None, False
        self._draft_seconds = 0.0
        if run.max_new_tokens == 0:
            self.planned = []
        elif self.prefilling:
            if not run.stats.prefill_passes:
                self._started = self._clock
            size = self.prefill_chunk if max_tokens is None else min(self.prefill_chunk,
                                                                     max_tokens)
            self.planned = run.prompt_ids[self.cursor:self.cursor + size]
        else:
            limit = min(run.max_new_tokens - len(run.output),
                        self.target.max_context - len(sequence)) - 1
            forced = self.constraint.forced(run.output, min(limit, self.forced_window)) \
                if self.constraint is not None and drafts else []
            self.forced = bool(forced)
            if forced:  # the constraint's own guess, verified like any draft
                self.drafts = forced
            else:
                self._propose(limit, drafts)
            self.planned = [sequence[-1], *self.drafts]
        return self.planned

    def _propose(self, limit: int, drafts: bool) -> None:
        """The drafter's proposal for the next pass, at the depth its policy sets: a chain in
        `drafts`, or a tree in `tree` (and its nodes in `drafts`)."""
        trees = self.trees
        # A tree's nodes are chosen after it is proposed (the policy weighs every node);
        # a chain's depth before. Either way nothing is proposed where no draft pays.
        started = time.perf_counter()
        # A copy, so a drafter cannot change the committed sequence.
        committed = tuple(self.sequence) if self.drafter is not None and drafts else ()
        if len(self.policies) > 1 and drafts and limit > 0:
            self.policy = self.policies[self.drafter.source(committed)]
        if self.policy is not None:
            depth = self.policy.depth(limit)
            limit = depth if not trees or depth == 0 else limit
        if self.drafter is None or not drafts or limit <= 0:
            return
        proposal = self.drafter.propose(committed, limit)
        self._draft_seconds = time.perf_counter() - started
        if self.policy is not None and self._proposed:  # the first one catches up
            proposed_depth = proposal.depth() if isinstance(proposal, DraftTree) \
                else len(proposal)
            self.policy.record_draft_time(self._draft_seconds, proposed_depth)
        self._proposed = True
        if isinstance(proposal, DraftTree) and trees and self.policy is not None:
            proposal = self.policy.select(proposal, limit)
            if proposal.is_chain:
                proposal = list(proposal.tokens)
        elif trees and self.policy is not None:
            proposal = proposal[:self.policy.depth(len(proposal), drafting=False)]
        if isinstance(proposal, DraftTree):
            if trees:
                self.tree = proposal
                self.drafts = list(proposal.tokens)
                return
            proposal = list(proposal.first_path())
        # Under a constraint, drafts it forbids would only be rows that cannot be kept.
        self.drafts = proposal if self.constraint is None else \
            self.constraint.cut(self.run.output, proposal)

    @property
    def draft_parents(self) -> list[int] | None:
        """Each draft's parent draft (-1: under the last committed token) for a tree, else
        None (a chain)."""
        return None if self.tree is None else list(self.tree.parents)

    def part(self) -> PassSequence:
        """This sequence's part of the next pass (after `plan`)."""
        parents = None
        if self.tree is not None:
            parents = tree_rows(self.sequence[-1], self.drafts, self.draft_parents)[1]
        return PassSequence(self.state, self.planned, parents)

    def advance(self, logits: np.ndarray | None,
                features: np.ndarray | None = None) -> Chunk | None:
        """Decide and commit what the planned pass holds; `logits` are its rows (every row
        when `rows` was "all", else the last one), `features` (optional) the final hidden
        rows of every token it appended, for a drafter that wants them."""
        run, stats = self.run, self.run.stats
        n_prompt = len(run.prompt_ids)
        if run.max_new_tokens == 0:
            return self._finish([], "length")
        if not self.wants_features:
            features = None
        if self.prefilling:
            if features is not None:
                self._prompt_features.append(features)
            self.cursor += len(self.planned)
            stats.prefill_passes += 1
            if self.prefilling:
                return None
            # The first token: a pass with no drafts, through the same verifier and transform.
            verdict = self._verdict(logits[-1:], [])
            stats.prefill_seconds = time.perf_counter() - self._started
            if self.drafter is not None:
                self.drafter.begin(tuple(run.prompt_ids),
                                   DraftContext(run.params, self.sampler, n_prompt))
                if self._prompt_features:
                    start = self.cursor - sum(len(rows) for rows in self._prompt_features)
                    self.drafter.observe(np.concatenate(self._prompt_features), start)
                self._prompt_features = []
            return self._commit(verdict.tokens, verdict.rows)
        if self.policy is not None and self.timed_passes:  # the pass, without the drafting
            self.policy.record_pass_time(len(self.planned), time.perf_counter() - self._clock -
                                         self._draft_seconds)
        drafts, tree = self.drafts, self.tree
        verdict = self._verdict(logits, drafts)
        # The state keeps the committed path: a tree's kept path, or a chain's kept prefix.
        if tree is not None:
            self.target.commit_tree(self.state, verdict.path)
        elif verdict.accepted < len(drafts):
            self.target.truncate(self.state, len(self.sequence) + verdict.accepted)
        stats.target_passes += 1
        if drafts:
            stats.drafted += len(drafts)
            stats.accepted += verdict.accepted
        if self.forced:  # the constraint's drafts: no feedback for the drafter or its policy
            stats.forced += len(drafts)
        elif drafts:
            self.drafter.accepted(len(drafts), verdict.accepted)
        if tree is not None:
            stats.tree_passes += 1
        if self.policy is not None and not self.forced:
            if tree is not None:
                self.policy.record_tree(tree, [row - 1 for row in verdict.path[1:]])
            else:
                self.policy.record(len(drafts), verdict.accepted)
        if features is not None:  # the positions the state keeps: the last token, kept drafts
            self.drafter.observe(features[verdict.path], len(self.sequence) - 1)
        stats.decode_seconds += time.perf_counter() - self._clock
        return self._commit(verdict.tokens, verdict.rows)

    def _verdict(self, rows: np.ndarray, drafts: list[int]) -> Verdict:
        run = self.run
        return self.verifier.verify(rows, drafts, parents=self.draft_parents,
                                    sampler=self.sampler, params=run.params,
                                    history=self.sequence, n_prompt=len(run.prompt_ids),
                                    transform=self.transform)

    def _commit(self, pending: list[int], rows: list[np.ndarray]) -> Chunk:
        """Commit `pending` (pending[j] sampled from rows[j]) token by token, up to a stop."""
        run, sequence, output = self.run, self.sequence, self.run.output
        committed, reason = [], None
        for j, token in enumerate(pending):
            if run.logprobs is not None:
                run.token_logprobs.append(self.sampler.logprobs(
                    rows[j], run.params, token=token, history=sequence,
                    n_prompt=len(run.prompt_ids), top=run.logprobs))
            sequence.append(token)
            output.append(token)
            committed.append(token)
            reason = run.stops.check(output)
            if reason is None and len(output) == run.max_new_tokens:
                reason = "length"
            if reason is None and len(sequence) == self.target.max_context:
                reason = "context"
            if reason is not None:
                return self._finish(committed, reason)
        if self.constraint is not None:  # where nothing may follow, the generation ends
            reason = self.constraint.ended(output)
            if reason is not None:
                return self._finish(committed, reason)
        text = run.stops.new_text(output) if self.stream_text else ""
        return Chunk(tokens=committed, text=text, logprobs=self._logprobs_of(committed))

    def _finish(self, committed: list[int], reason: str) -> Chunk:
        run = self.run
        self.finished = True
        if reason in ("length", "context") and self.constraint is not None and \
                not self.constraint.complete(run.output):
            reason = "incomplete"
        text = run.stops.new_text(run.output, final=True) if self.stream_text else ""
        run.final = run.result(reason)
        return Chunk(tokens=committed, text=text, result=run.final,
                     logprobs=self._logprobs_of(committed))

    def _logprobs_of(self, committed: list[int]) -> list[TokenLogprob] | None:
        if self.run.logprobs is None:
            return None
        end = len(self.run.output)
        return self.run.token_logprobs[end - len(committed):end]
