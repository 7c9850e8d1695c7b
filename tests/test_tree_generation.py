"""Token trees in the Generator: drafted == serial, tokens and logprobs bit for bit, when the
drafts are trees verified in one pass; the load-time guard turns trees off on a target whose tree
pass is not a serial step over each path, and the same target with the guard off writes other
tokens (the negative control). Trees that hide the target's own sample under rejected siblings
write the serial tokens with commit_tree's path check off, and a walk that steps into a
rejected subtree is caught by the bits alone (the negative control)."""

from __future__ import annotations

import random
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import exactdraft as xd
from exactdraft.drafters.base import DraftTree
from exactdraft.drafters.depth import DepthPolicy
from exactdraft.verify import ExactVerifier, Verdict, tree_rows

# Short prompts for the oracle drafter; long random ones (the tiny vocabulary has 128 tokens)
# in which most tokens recur with different successors, so one-token matches branch.
PROMPTS = ([17, 4, 17, 4, 17, 4, 22, 17, 4], [8, 2, 6, 1, 8, 2, 7, 1, 8, 2],
           [5, 9, 13, 5, 9, 14, 5, 9, 13, 5, 9])
LONG_PROMPTS = [random.Random(seed).choices(range(128), k=90) for seed in range(3)]
CASES = [(0.0, {}), (1.0, {"seed": 3}), (0.8, {"seed": 5, "top_k": 20, "top_p": 0.9}),
         (1.2, {"seed": 9, "min_p": 0.05, "repetition_penalty": 1.1})]


@pytest.fixture(scope="module")
def cpu_target(tiny_checkpoints):
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.pretrained import build_target, load_checkpoint

    return build_target(load_checkpoint(tiny_checkpoints["llama"]), TorchCPUBackend())


class OracleTreeDrafter:
    """Proposes trees that hold the serial continuation on one branch and random siblings
    around it, so paths are accepted at every depth and branch off the first child too."""

    max_draft = 6
    tree_width = 3

    def __init__(self, serial: list[int], prompt_length: int, seed: int) -> None:
        self.serial, self.prompt_length = serial, prompt_length
        self.random = random.Random(seed)
        self.kept: list[int] = []  # how many nodes each verified tree kept

    def begin(self, prompt, context) -> None:
        pass

    def propose(self, sequence, limit):
        done = len(sequence) - self.prompt_length
        truth = self.serial[done:done + limit]
        tokens, parents, parent = [], [], -1
        for token in truth:
            if len(tokens) + 2 > limit:
                break
            wrong = (token + 1 + self.random.randrange(63)) % 64
            if self.random.random() < 0.2:
                tokens.append(wrong)  # a level without the true token: rejected here
                parents.append(parent)
                break
            siblings = [wrong, token] if self.random.random() < 0.5 else [token, wrong]
            tokens.extend(siblings)
            parents.extend([parent, parent])
            parent = len(tokens) - 2 + siblings.index(token)
        return DraftTree(tuple(tokens), tuple(parents))

    def accepted(self, proposed, accepted) -> None:
        self.kept.append(accepted)


class ChainTreeTarget:
    """A target whose tree pass ignores the parents: each row attends to every row before it,
    as a backend without tree attention would compute. Everything else is the target's own."""

    def __init__(self, target) -> None:
        self._target = target

    def __getattr__(self, name):
        return getattr(self._target, name)

    def forward_tree(self, state, tokens, parents):
        start = state.cache.length
        logits = self._target.forward(state, tokens, rows="all")
        state.tree = (start, list(parents))
        return logits


def runs(generator, prompt, temperature, extra, max_new_tokens=20):
    params = dict(temperature=temperature, **extra)
    drafted = generator.generate(prompt, max_new_tokens, logprobs=3, **params)
    serial = generator.generate(prompt, max_new_tokens, logprobs=3, drafts=False, **params)
    return drafted, serial


def same(drafted, serial) -> bool:
    return drafted.tokens == serial.tokens and drafted.logprobs == serial.logprobs


@pytest.mark.parametrize("drafter", [xd.SuffixDrafter(max_draft=6, min_match=1, tree_width=3),
                                     xd.PromptLookup(max_draft=6, min_match=1, tree_width=2)],
                         ids=["suffix", "lookup"])
def test_tree_drafters_write_the_serial_tokens(cpu_target, drafter):
    generator = xd.Generator(cpu_target, drafter, adaptive_depth=False, strict=True)
    assert generator.trees, generator.tree_note
    tree_passes = 0
    for prompt in LONG_PROMPTS:
        for temperature, extra in CASES:
            drafted, serial = runs(generator, prompt, temperature, extra)
            assert same(drafted, serial), (prompt, temperature, extra)
            assert drafted.stats.drafter_faults.total == 0
            tree_passes += drafted.stats.tree_passes
    assert tree_passes > 0


def test_trees_accepted_at_every_depth_write_the_serial_tokens(cpu_target):
    accepted_depths = set()
    for index, prompt in enumerate(PROMPTS):
        for temperature, extra in CASES:
            probe = xd.Generator(cpu_target)
            serial = probe.generate(prompt, 24, temperature=temperature, logprobs=3, **extra)
            drafter = OracleTreeDrafter(serial.tokens, len(prompt), seed=index)
            generator = xd.Generator(cpu_target, drafter, adaptive_depth=False, strict=True)
            assert generator.trees
            drafted = generator.generate(prompt, 24, temperature=temperature, logprobs=3,
                                         **extra)
            assert same(drafted, serial), (prompt, temperature, extra)
            assert drafted.stats.tree_passes > 0
            accepted_depths.update(drafter.kept)
    assert {0, 1, 2}.issubset(accepted_depths), accepted_depths


def test_guard_turns_trees_off_on_a_target_without_tree_attention(cpu_target):
    target = ChainTreeTarget(cpu_target)
    with pytest.warns(RuntimeWarning, match="token trees are off"):
        generator = xd.Generator(target, xd.SuffixDrafter(max_draft=6, tree_width=3),
                                 adaptive_depth=False)
    assert not generator.trees and generator.drafting_enabled
    for prompt in PROMPTS:
        for temperature, extra in CASES:
            drafted, serial = runs(generator, prompt, temperature, extra)
            assert same(drafted, serial)
            assert drafted.stats.tree_passes == 0


def test_negative_control_tree_pass_without_tree_attention_changes_tokens(cpu_target):
    """With the guard off the same target verifies trees, and a branch row off the first path
    is not a serial step (it attends to its siblings, at the wrong position): the drafted runs
    that keep such a branch differ from serial ones."""
    target = ChainTreeTarget(cpu_target)
    differing = tree_passes = 0
    for index, prompt in enumerate(PROMPTS):
        for temperature, extra in CASES:
            serial = xd.Generator(cpu_target).generate(prompt, 24, temperature=temperature,
                                                       logprobs=3, **extra)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                generator = xd.Generator(target, OracleTreeDrafter(serial.tokens, len(prompt),
                                                                   seed=index),
                                         adaptive_depth=False, guard=False)
            assert generator.trees
            drafted = generator.generate(prompt, 24, temperature=temperature, logprobs=3,
                                         **extra)
            differing += not same(drafted, serial)
            tree_passes += drafted.stats.tree_passes
    assert tree_passes > 0 and differing > 0, (tree_passes, differing)


def test_a_chain_only_drafter_never_runs_tree_passes(cpu_target):
    generator = xd.Generator(cpu_target, xd.SuffixDrafter(max_draft=6), adaptive_depth=False)
    assert not generator.trees and generator.tree_note is None
    drafted, serial = runs(generator, PROMPTS[0], 1.0, {"seed": 1})
    assert same(drafted, serial) and drafted.stats.tree_passes == 0


class FirstChoiceDrafter(OracleTreeDrafter):
    """Trees whose first child at each depth is the serial token 70% of the time (else two
    wrong tokens end the tree): a sibling never wins."""

    def propose(self, sequence, limit):
        done = len(sequence) - self.prompt_length
        tokens, parents, parent = [], [], -1
        for token in self.serial[done:done + limit]:
            if len(tokens) + 2 > limit:
                break
            wrong = (token + 1 + self.random.randrange(62)) % 64
            right = self.random.random() < 0.7
            tokens.extend([token if right else wrong, (wrong + 1) % 64])
            parents.extend([parent, parent])
            if not right or (wrong + 1) % 64 == token:
                break
            parent = len(tokens) - 2
        return DraftTree(tuple(tokens), tuple(parents))


def adaptive(generator):
    """The generator with fixed pass costs (each row adds a tenth of a step), so the policy's
    choices do not depend on this machine's timings."""
    generator.depth_policy = DepthPolicy([1.0 + 0.1 * width for width in range(7)])
    return generator


@pytest.mark.parametrize("kind", [OracleTreeDrafter, FirstChoiceDrafter])
def test_adaptive_trees_write_the_serial_tokens_and_follow_acceptance(cpu_target, kind):
    """The policy picks each pass's nodes: the tokens stay serial's; a drafter whose siblings
    never win gets chains (fewer nodes per pass than fixed trees), one whose second choices
    win keeps its trees (the negative control)."""
    nodes = {True: 0, False: 0}
    passes = {True: 0, False: 0}
    for index, prompt in enumerate(PROMPTS):
        for temperature, extra in CASES:
            probe = xd.Generator(cpu_target)
            serial = probe.generate(prompt, 24, temperature=temperature, logprobs=3, **extra)
            for policy in (True, False):
                drafter = kind(serial.tokens, len(prompt), seed=index)
                generator = xd.Generator(cpu_target, drafter, adaptive_depth=policy,
                                         strict=True)
                if policy:
                    adaptive(generator)
                drafted = generator.generate(prompt, 24, temperature=temperature, logprobs=3,
                                             **extra)
                assert same(drafted, serial), (kind, policy, prompt, temperature, extra)
                nodes[policy] += drafted.stats.drafted
                passes[policy] += drafted.stats.tree_passes
    assert passes[False] > 0
    if kind is FirstChoiceDrafter:
        assert passes[True] < passes[False] / 2, passes
    else:
        assert passes[True] > passes[False] * 3 / 4, passes


class CorruptingTreeDrafter:
    """Random trees around the serial continuation, corrupted on purpose: each level holds
    `width` (1..max_width) siblings, the true token at a random rank unless the level is
    corrupted (then every sibling is wrong and the true path ends there); wrong nodes may carry
    subtrees of their own (never to be kept), siblings may repeat, and the nodes are listed in
    a random order that keeps parents before children; at most `limit` nodes, those built
    first. All randomness comes from `seed`."""

    def __init__(self, serial: list[int], prompt_length: int, seed: int, max_width: int,
                 max_draft: int, error_rate: float, vocab_size: int = 128) -> None:
        self.serial, self.prompt_length = serial, prompt_length
        self.random = random.Random(seed)
        self.max_width, self.max_draft, self.error_rate = max_width, max_draft, error_rate
        # Declared tree drafting even at width 1 (subtrees under wrong nodes still branch).
        self.tree_width, self.vocab_size = max(2, max_width), vocab_size

    def begin(self, prompt, context) -> None:
        pass

    def wrong(self, token: int) -> int:
        return (token + 1 + self.random.randrange(self.vocab_size - 1)) % self.vocab_size

    def propose(self, sequence, limit):
        done = len(sequence) - self.prompt_length
        nodes: list[tuple[int, int]] = []  # (token, parent), parents first
        parent = -1
        for token in self.serial[done:done + self.max_draft]:
            width = self.random.randint(1, self.max_width)
            corrupted = self.random.random() < self.error_rate
            rank = -1 if corrupted else self.random.randrange(width)
            level = len(nodes)
            for r in range(width):
                nodes.append((token if r == rank else self.wrong(token), parent))
            for wrong_node in range(level, level + width):  # subtrees under wrong nodes
                if wrong_node != level + rank and self.random.random() < 0.3:
                    nodes.append((self.random.randrange(self.vocab_size), wrong_node))
            if corrupted:
                break
            parent = level + rank
        return DraftTree(*shuffled_topologically(nodes[:limit], self.random))

    def accepted(self, proposed, accepted) -> None:
        pass


def shuffled_topologically(nodes: list[tuple[int, int]], rng: random.Random) -> tuple:
    """(tokens, parents) of the tree `nodes` in a random order with parents before children."""
    order, placed, ready = [], {-1: -1}, [i for i, (_, p) in enumerate(nodes) if p == -1]
    while ready:
        node = ready.pop(rng.randrange(len(ready)))
        placed[node] = len(order)
        order.append(node)
        ready += [i for i, (_, p) in enumerate(nodes) if p == node]
    return (tuple(nodes[i][0] for i in order), tuple(placed[nodes[i][1]] for i in order))


def corrupted_tree_runs(target, guard, temperature, top_k, top_p, repetition, seed, width,
                        depth, error_rate, prompt, max_new):
    """Drafted and serial runs (tokens and top-3 logprobs) with the corrupting drafter."""
    params = dict(temperature=temperature, top_k=top_k, top_p=top_p,
                  repetition_penalty=repetition, seed=seed)
    serial = xd.Generator(target).generate(prompt, max_new, logprobs=3, stop_tokens=[],
                                           **params)
    drafter = CorruptingTreeDrafter(serial.tokens, len(prompt), seed, width, depth, error_rate)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no drafter fault: every proposal is a valid tree
        generator = xd.Generator(target, drafter, adaptive_depth=False, guard=guard,
                                 strict=guard)
    assert generator.trees
    drafted = generator.generate(prompt, max_new, logprobs=3, stop_tokens=[], **params)
    return drafted, serial


TREE_SETTINGS = dict(temperature=st.sampled_from([0.0, 0.5, 1.0, 1.5]),
                     top_k=st.sampled_from([0, 5]), top_p=st.sampled_from([1.0, 0.8]),
                     repetition=st.sampled_from([1.0, 1.2]), seed=st.integers(0, 2**63),
                     width=st.integers(1, 4), depth=st.integers(1, 7),
                     error_rate=st.sampled_from([0.0, 0.3, 1.0]),
                     prompt=st.lists(st.integers(0, 127), min_size=1, max_size=30),
                     max_new=st.integers(1, 24))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**TREE_SETTINGS)
def test_random_corrupted_trees_write_the_serial_tokens(cpu_target, temperature, top_k, top_p,
                                                        repetition, seed, width, depth,
                                                        error_rate, prompt, max_new):
    drafted, serial = corrupted_tree_runs(cpu_target, True, temperature, top_k, top_p,
                                          repetition, seed, width, depth, error_rate, prompt,
                                          max_new)
    assert same(drafted, serial)
    assert drafted.stats.drafter_faults.total == 0
    if max_new > 2:  # room for a draft after the first token: a tree was verified
        assert drafted.stats.drafted > 0


def test_negative_control_random_corrupted_trees_on_chain_attention(cpu_target):
    """The same runs on a target whose tree pass ignores the parents (guard off) write other
    tokens or logprobs in some of a fixed sample of the settings above."""
    rng = random.Random(7)
    differing = 0
    for case in range(20):
        prompt = [rng.randrange(128) for _ in range(rng.randint(5, 30))]
        drafted, serial = corrupted_tree_runs(ChainTreeTarget(cpu_target), False, 1.0, 0, 1.0,
                                              1.0, case, 3, 6, 0.0, prompt, 24)
        differing += not same(drafted, serial)
    assert differing > 0


class DecoyTreeDrafter:
    """Trees that tempt a walk off the kept path: at every depth the serial token's node has two
    rejected siblings, and each rejected node has a child holding the next serial token (the
    target's own sample after the true node), one listed before the true child and one after
    it; at a random depth the true path ends, so there the target's sample sits only under
    rejected nodes. A walk that looks for the sample anywhere but among the current node's own
    children steps into a rejected subtree."""

    max_draft = 10
    tree_width = 3

    def __init__(self, serial: list[int], prompt_length: int, seed: int) -> None:
        self.serial, self.prompt_length = serial, prompt_length
        self.random = random.Random(seed)
        self.kept: list[int] = []

    def begin(self, prompt, context) -> None:
        pass

    def wrong(self, token: int) -> int:
        return (token + 1 + self.random.randrange(127)) % 128

    def propose(self, sequence, limit):
        done = len(sequence) - self.prompt_length
        truth = self.serial[done:done + 4]
        end = self.random.randrange(len(truth) + 1)  # the depth where the true path stops
        nodes: list[tuple[int, int]] = []  # (token, parent), parents first
        parent, rejected = -1, []
        for depth, token in enumerate(truth):
            if rejected:  # a decoy before the true child
                nodes.append((token, rejected[0]))
            true_node = len(nodes)
            if depth < end:
                nodes.append((token, parent))
            if rejected:  # and one after it
                nodes.append((token, rejected[1]))
            rejected = [len(nodes), len(nodes) + 1]
            nodes += [(self.wrong(token), parent), (self.wrong(token), parent)]
            if depth >= end:
                break
            parent = true_node
        nodes = nodes[:limit]
        return DraftTree(tuple(t for t, _ in nodes), tuple(p for _, p in nodes))

    def accepted(self, proposed, accepted) -> None:
        self.kept.append(accepted)


class WalkByDepth(ExactVerifier):
    """A plausible wrong verifier: it looks for the sample among all nodes one level deeper
    (the first or the last listed), not among the current node's children."""

    def __init__(self, last_listed: bool) -> None:
        self.last_listed = last_listed

    def verify(self, rows, drafts, *, parents=None, sampler, params, history, n_prompt,
               transform=None):
        if parents is None:  # chains have one node per level: the walk is the right one
            return super().verify(rows, drafts, sampler=sampler, params=params,
                                  history=history, n_prompt=n_prompt, transform=transform)
        tokens, row_parents = tree_rows(history[-1], drafts, parents)
        depth, by_level = [0] * len(tokens), {}
        for row in range(1, len(tokens)):
            depth[row] = depth[row_parents[row]] + 1
            level = by_level.setdefault(depth[row] - 1, {})
            if self.last_listed or tokens[row] not in level:
                level[tokens[row]] = row
        path, kept, drawn, past, row = [0], [], [], list(history), 0
        while True:
            drawn.append(rows[row])
            token = sampler.sample(rows[row], params, pos=len(past), history=past,
                                   n_prompt=n_prompt)
            child = by_level.get(depth[row], {}).get(token)
            if child is None:
                return Verdict(kept=kept, token=token, path=path, rows=drawn)
            kept.append(token)
            past.append(token)
            path.append(child)
            row = child


@pytest.fixture
def without_path_check(monkeypatch):
    """commit_tree without its check that the committed path runs down the tree, so that only
    the tokens and logprobs can tell a wrong walk."""
    import exactdraft.models.decoder

    monkeypatch.setattr(exactdraft.models.decoder, "check_path", lambda parents, path: None)


def decoy_runs(target, verifier=None):
    """(drafted, serial) pairs with the decoy drafter over PROMPTS and CASES."""
    pairs = []
    for index, prompt in enumerate(PROMPTS):
        for temperature, extra in CASES:
            serial = xd.Generator(target).generate(prompt, 24, temperature=temperature,
                                                   logprobs=3, stop_tokens=[], **extra)
            drafter = DecoyTreeDrafter(serial.tokens, len(prompt), seed=index)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # every proposal is a valid tree
                generator = xd.Generator(target, drafter, verifier, adaptive_depth=False)
            assert generator.trees
            drafted = generator.generate(prompt, 24, temperature=temperature, logprobs=3,
                                         stop_tokens=[], **extra)
            pairs.append((drafted, serial))
    return pairs


def test_the_target_sample_under_a_rejected_sibling_is_never_kept(cpu_target,
                                                                  without_path_check):
    pairs = decoy_runs(cpu_target)
    for drafted, serial in pairs:
        assert same(drafted, serial)
        assert drafted.stats.drafter_faults.total == 0
    assert sum(d.stats.tree_passes for d, _ in pairs) > 0
    assert sum(d.stats.accepted for d, _ in pairs) > 0


@pytest.mark.parametrize("last_listed", [False, True], ids=["first-listed", "last-listed"])
def test_negative_control_a_walk_into_rejected_subtrees_changes_tokens(cpu_target, monkeypatch,
                                                                       last_listed):
    """The same runs with a walk that takes the sample from any node one level deeper: with
    the path check off, tokens or logprobs differ; with it on, commit_tree refuses the path."""
    import exactdraft.models.decoder

    verifier = WalkByDepth(last_listed)
    with pytest.raises(xd.ParameterError, match="is not a child of row"):
        decoy_runs(cpu_target, verifier)
    monkeypatch.setattr(exactdraft.models.decoder, "check_path", lambda parents, path: None)
    differing = sum(not same(drafted, serial)
                    for drafted, serial in decoy_runs(cpu_target, verifier))
    assert differing > 0
