"""One generation, advanced one target pass at a time, and what it produces.

Invariant: Decoding commits exactly the tokens serial decoding writes, whatever the passes that
carry it look like: one sequence per pass or many (the engine), prompt chunks of any size, a
prompt prefix already in the state (a cached prefix), drafts or none. Every committed token is
the target's keyed sample from its own row (drafts are kept only when the verifier finds them
equal to it), and every stop condition (stop token, stop string, max_new_tokens, context) is
checked token by token on committed tokens, so a run stops at the very token where the serial
run stops. Logprobs are computed from the same rows and histories as the tokens.

Features: when the drafter declares `wants_features` (DraftHead), `wants_features` is true
and the pass should also return the final hidden rows it appended (target.forward(...,
features=True)); `advance(logits, features)` then hands the drafter, through
`drafter.observe(rows, start)`, the rows of the positions the state keeps (the prompt's once
the drafter has begun, then each pass's committed positions). They feed the drafter only: a
pass run without them (the engine's) just leaves such a drafter with nothing to draft from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from exactdraft.drafters.base import DraftContext, Drafter, DraftTree
from exactdraft.drafting import CheckedDrafter, DrafterFaults
from exactdraft.sampling import SamplingParams, TokenLogprob
from exactdraft.stops import StopMatcher
from exactdraft.tree_verify import target_rows, walk_tree
from exactdraft.verify import ComputedPass

if TYPE_CHECKING:
    from exactdraft.generator import Generator


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_passes: int = 0
    target_passes: int = 0  # decode and verify passes after the prefill
    drafted: int = 0
    accepted: int = 0
    tree_passes: int = 0  # verify passes over a token tree (drafted counts its nodes)
    prefill_seconds: float = 0.0  # time to first token
    decode_seconds: float = 0.0
    drafting: bool = False
    drafting_note: str | None = None  # why drafting was off, when it was requested
    # What the drafter did wrong in this run (its bad drafts were dropped), by kind.
    drafter_faults: DrafterFaults = field(default_factory=DrafterFaults)

    @property
    def wall_seconds(self) -> float:
        return self.prefill_seconds + self.decode_seconds

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """Tokens committed per target pass after the first token."""
        after_first = max(self.generated_tokens - 1, 0)
        return after_first / self.target_passes if self.target_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first one per second of decoding."""
        after_first = max(self.generated_tokens - 1, 0)
        return after_first / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass
class GenerationResult:
    tokens: list[int]
    text: str | None
    # "stop", "length", "context", or "interrupted" (Stream.result of a stream cut short)
    finish_reason: str
    seed: int
    stats: GenerationStats
    prompt_tokens: list[int] = field(default_factory=list)
    stop: int | str | None = None  # the stop token or stop string that ended the run
    # One per token when logprobs were asked for (generate(..., logprobs=N)), else None.
    logprobs: list[TokenLogprob] | None = None


@dataclass
class Chunk:
    """One step of a stream: tokens committed in that step and the text they complete."""

    tokens: list[int]
    text: str
    result: GenerationResult | None = None  # set on the last chunk
    logprobs: list[TokenLogprob] | None = None  # one per token, when asked for

    @property
    def finish_reason(self) -> str | None:
        return None if self.result is None else self.result.finish_reason


class Run:
    """The state of one generation, readable while it is under way: its checked request (the
    prompt ids, parameters with a resolved seed, the stop matcher, max_new_tokens, whether to
    draft, how many top logprobs to keep) and what it has committed."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, stops: StopMatcher,
                 max_new_tokens: int, use_drafts: bool = True,
                 logprobs: int | None = None) -> None:
        self.prompt_ids, self.params, self.stops = prompt_ids, params, stops
        self.max_new_tokens = max_new_tokens
        self.use_drafts = use_drafts
        self.logprobs = logprobs  # None: off; N: each token's logprob and the N most probable
        self.stats = GenerationStats(prompt_tokens=len(prompt_ids))
        self.output: list[int] = []
        self.token_logprobs: list[TokenLogprob] = []
        self.final: GenerationResult | None = None

    def with_seed(self, seed: int) -> Run:
        """A fresh run of the same request with another seed (and nothing committed)."""
        stops = StopMatcher(self.stops.strings, sorted(self.stops.tokens), self.stops.tokenizer)
        return Run(self.prompt_ids, replace(self.params, seed=seed), stops, self.max_new_tokens,
                   self.use_drafts, self.logprobs)

    def result(self, reason: str) -> GenerationResult:
        self.stats.generated_tokens = len(self.output)
        logprobs = None if self.logprobs is None else \
            list(self.token_logprobs[:len(self.output)])
        return GenerationResult(tokens=list(self.output), text=self.stops.final_text(self.output),
                                finish_reason=reason, seed=self.params.seed, stats=self.stats,
                                prompt_tokens=list(self.prompt_ids), stop=self.stops.matched,
                                logprobs=logprobs)


class Decoding:
    """One generation advanced one target pass at a time: the loop body that Generator runs
    for one sequence and the engine runs for many sequences sharing passes.

    A step is `tokens = decoding.plan(...)`, one target pass appending `tokens` to
    `decoding.state` with rows `decoding.rows`, then `decoding.advance(logits)`, which decides
    and commits what that pass holds and returns the step's chunk (None after a prompt chunk
    that is not the last). A plan with no tokens (max_new_tokens 0) needs no pass: advance(None).
    The prompt's first `state.length` positions may already be in the state (a cached prefix);
    that changes no bit (chunked prefill equals one-pass prefill). Whatever `plan` is allowed
    (prompt tokens per pass, drafts or none), the committed tokens are the same."""

    def __init__(self, generator: Generator, run: Run, stream_text: bool,
                 state: Any = None, drafter: Drafter | None = None,
                 timed_passes: bool = True) -> None:
        target = self.target = generator.target
        self.run, self.stream_text = run, stream_text
        self.verifier, self.sampler = generator.verifier, generator.sampler
        self.prefill_chunk = generator.prefill_chunk
        self.state = target.new_state() if state is None else state
        self.cursor = self.state.length  # prompt positions in the state
        self.sequence = list(run.prompt_ids)
        use = run.use_drafts and generator.drafting_enabled
        self.drafter = CheckedDrafter(drafter or generator.drafter, target.vocab_size,
                                      generator.max_draft, generator.trees) if use else None
        stats = run.stats
        stats.drafting = self.drafter is not None
        if self.drafter is not None:
            stats.drafter_faults = self.drafter.faults
        stats.drafting_note = generator.drafting_note if run.use_drafts else None
        # A policy per generation, as if reset: the Generator's holds the measured costs.
        self.policy = generator.depth_policy.fresh() \
            if self.drafter is not None and generator.depth_policy is not None else None
        # A drafter of several sources (FallbackDrafter) gets a policy per source: each
        # source's acceptance and time set the depth asked of it.
        self.policies = [self.policy] + [self.policy.fresh() for _ in
                                         range(self.drafter.sources - 1)] \
            if self.policy is not None else []
        self.planned: list[int] = []  # the tokens of the pass being run
        self.drafts: list[int] = []  # the drafts among them
        self.tree: DraftTree | None = None  # the drafts' tree, when they are one
        self.parents: list[int] | None = None  # each planned row's parent row, for a tree
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
            getattr(self.target, "returns_features", False) is True

    def plan(self, max_tokens: int | None = None, drafts: bool = True,
             trees: bool = False) -> list[int]:
        """The tokens the next pass appends: a prompt chunk (at most `max_tokens`) while
        prefilling, else the last committed token and the drafts (none if not `drafts`).
        With `trees` the drafts may be a token tree: then `parents` is set and the pass must
        be target.forward_tree(state, tokens, parents); else it is None."""
        run, sequence = self.run, self.sequence
        self._clock = time.perf_counter()
        self.drafts, self.tree, self.parents = [], None, None
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
            # A tree's nodes are chosen after it is proposed (the policy weighs every node);
            # a chain's depth before. Either way nothing is proposed where no draft pays.
            started = time.perf_counter()
            # A copy, so a drafter cannot change the committed sequence.
            committed = tuple(sequence) if self.drafter is not None and drafts else ()
            if len(self.policies) > 1 and drafts and limit > 0:
                self.policy = self.policies[self.drafter.source(committed)]
            if self.policy is not None:
                depth = self.policy.depth(limit)
                limit = depth if not trees or depth == 0 else limit
            if self.drafter is not None and drafts and limit > 0:
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
                        self.planned, self.parents = target_rows(proposal, sequence[-1])
                        self.drafts = list(proposal.tokens)
                        return self.planned
                    proposal = list(proposal.first_path())
                self.drafts = proposal
            self.planned = [sequence[-1], *self.drafts]
        return self.planned

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
            first = self.sampler.sample(logits[-1], run.params, pos=n_prompt,
                                        history=self.sequence, n_prompt=n_prompt)
            stats.prefill_seconds = time.perf_counter() - self._started
            if self.drafter is not None:
                self.drafter.begin(tuple(run.prompt_ids),
                                   DraftContext(run.params, self.sampler, n_prompt))
                if self._prompt_features:
                    start = self.cursor - sum(len(rows) for rows in self._prompt_features)
                    self.drafter.observe(np.concatenate(self._prompt_features), start)
                self._prompt_features = []
            return self._commit([first], logits[-1:])
        if self.policy is not None and self.timed_passes:  # the pass, without the drafting
            self.policy.record_pass_time(len(self.planned), time.perf_counter() - self._clock -
                                         self._draft_seconds)
        drafts = self.drafts
        if self.tree is not None:
            return self._advance_tree(logits, features)
        verdict = self.verifier.verify(
            ComputedPass(self.target, self.planned, logits, all_rows=bool(drafts)), self.state,
            drafts, sampler=self.sampler, params=run.params, history=self.sequence,
            n_prompt=n_prompt)
        stats.target_passes += 1
        if drafts:
            stats.drafted += len(drafts)
            stats.accepted += verdict.accepted
            self.drafter.accepted(len(drafts), verdict.accepted)
        if self.policy is not None:
            self.policy.record(len(drafts), verdict.accepted)
        if features is not None:  # the positions the state keeps: the last token, kept drafts
            self.drafter.observe(features[:verdict.accepted + 1], len(self.sequence) - 1)
        stats.decode_seconds += time.perf_counter() - self._clock
        return self._commit([*drafts[:verdict.accepted], verdict.token], logits)

    def _advance_tree(self, logits: np.ndarray, features: np.ndarray | None) -> Chunk:
        """Walk the tree's rows for the deepest path of the target's own samples, and keep
        that path in the state (tree_verify says why this writes the serial tokens)."""
        run, stats, tree = self.run, self.run.stats, self.tree
        path, verdict = walk_tree(logits, tree, sampler=self.sampler, params=run.params,
                                  history=self.sequence, n_prompt=len(run.prompt_ids))
        self.target.commit_tree(self.state, path)
        stats.target_passes += 1
        stats.drafted += len(tree)
        stats.accepted += verdict.accepted
        stats.tree_passes += 1
        self.drafter.accepted(len(tree), verdict.accepted)
        if self.policy is not None:
            self.policy.record_tree(tree, [row - 1 for row in path[1:]])
        if features is not None:
            self.drafter.observe(features[path], len(self.sequence) - 1)
        stats.decode_seconds += time.perf_counter() - self._clock
        return self._commit([*verdict.kept, verdict.token], logits[path])

    def _commit(self, pending: list[int], rows: np.ndarray) -> Chunk:
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
        text = run.stops.new_text(output) if self.stream_text else ""
        return Chunk(tokens=committed, text=text, logprobs=self._logprobs_of(committed))

    def _finish(self, committed: list[int], reason: str) -> Chunk:
        run = self.run
        self.finished = True
        text = run.stops.new_text(run.output, final=True) if self.stream_text else ""
        run.final = run.result(reason)
        return Chunk(tokens=committed, text=text, result=run.final,
                     logprobs=self._logprobs_of(committed))

    def _logprobs_of(self, committed: list[int]) -> list[TokenLogprob] | None:
        if self.run.logprobs is None:
            return None
        end = len(self.run.output)
        return self.run.token_logprobs[end - len(committed):end]
