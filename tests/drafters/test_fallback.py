"""FallbackDrafter: the first drafter with a guess proposes, drafted == serial with lookup then a
trained head, each source gets its own depth policy, and a misbehaving `source` costs nothing."""

from __future__ import annotations

import numpy as np
import pytest

import exactdraft as xd
from exactdraft import DraftContext, FallbackDrafter, KeyedSampler, ParameterError, PromptLookup
from exactdraft.drafters.base import DraftTree
from exactdraft.drafters.depth import DepthPolicy
from tests.drafters.test_head import FILTERS, PROMPTS, TEMPERATURES, train_heads
from tests.exactness import ExactnessCheck

CONTEXT = DraftContext(params=xd.SamplingParams(), sampler=KeyedSampler(), n_prompt=3)


class Recording:
    """A drafter with fixed guesses (none when `guesses` is empty) that records its calls."""

    def __init__(self, guesses, max_draft=6, wants_features=False, tree_width=1):
        self.guesses, self.max_draft = guesses, max_draft
        self.wants_features, self.tree_width = wants_features, tree_width
        self.proposed, self.feedback, self.observed, self.begun = [], [], [], 0

    def begin(self, prompt, context):
        self.begun += 1

    def propose(self, sequence, limit):
        self.proposed.append(limit)
        return self.guesses[:limit] if isinstance(self.guesses, list) else self.guesses

    def accepted(self, proposed, accepted):
        self.feedback.append((proposed, accepted))

    def observe(self, features, start):
        self.observed.append(start)


def test_the_first_drafter_with_a_guess_proposes_and_gets_the_feedback():
    copy, fallback = Recording([4, 5, 6, 7]), Recording([9, 9], max_draft=2,
                                                        wants_features=True)
    drafter = FallbackDrafter(copy, fallback)
    assert (drafter.max_draft, drafter.wants_features, drafter.sources) == (6, True, 2)
    drafter.begin((1, 2, 3), CONTEXT)
    assert copy.begun == fallback.begun == 1
    assert drafter.source((1, 2, 3)) == 0
    assert drafter.propose((1, 2, 3), 3) == [4, 5, 6]
    assert copy.proposed == [6]  # asked once, at its own max_draft, then cut to the limit
    drafter.accepted(3, 2)
    assert copy.feedback == [(3, 2)] and fallback.feedback == []
    copy.guesses = []
    assert drafter.propose((1, 2, 3, 4), 5) == [9, 9]
    assert fallback.proposed == [2]  # never more than its own max_draft
    drafter.accepted(2, 0)
    assert fallback.feedback == [(2, 0)] and copy.feedback == [(3, 2)]
    drafter.observe(np.zeros((2, 4), np.float32), 3)
    assert fallback.observed == [3] and copy.observed == []


def test_a_tree_is_cut_to_the_limit_as_a_tree():
    tree = DraftTree((4, 8, 5, 9, 6), (-1, -1, 0, 1, 2))
    drafter = FallbackDrafter(Recording(tree, tree_width=2), Recording([1]))
    assert drafter.tree_width == 2
    cut = drafter.propose((1, 2), 3)
    assert (cut.tokens, cut.parents) == ((4, 8, 5), (-1, -1, 0))


@pytest.mark.parametrize("drafters, match", [
    ((PromptLookup(),), "at least two"),
    ((PromptLookup(), object()), "drafter 1 .*no max_draft"),
])
def test_bad_arguments_are_refused(drafters, match):
    with pytest.raises(ParameterError, match=match):
        FallbackDrafter(*drafters)


def test_drafters_of_different_vocabularies_are_refused():
    small, large = Recording([1]), Recording([1])
    small.vocab_size, large.vocab_size = 100, 200
    with pytest.raises(ParameterError, match=r"different vocabularies: \[100, 200\]"):
        FallbackDrafter(small, large)


class CountingFallback(FallbackDrafter):
    """Counts the verified passes whose drafts each drafter made."""

    def __init__(self, *drafters):
        super().__init__(*drafters)
        self.verified = [0] * len(drafters)

    def accepted(self, proposed, accepted):
        self.verified[self._proposer] += 1
        super().accepted(proposed, accepted)


class OnePolicy(FallbackDrafter):
    sources = 1  # the negative control: one depth policy for both drafters


@pytest.fixture(scope="module")
def llama_head_folder(tiny_targets, tiny_checkpoints, tmp_path_factory):
    return train_heads(tiny_targets.__getitem__, tiny_checkpoints, ("llama",),
                       tmp_path_factory)["llama"]


def lookup_then_head_runs(target, head_folder, filters: dict, adaptive: bool) -> tuple:
    """Drafted runs against serial ones over TEMPERATURES x 2 seeds on prompts that repeat
    (lookup has something to copy) and replies that do not only (the head drafts too):
    the exactness check and how many verified passes each source drafted."""
    serial = xd.Generator(target)
    check = ExactnessCheck()
    verified = [0, 0]  # passes whose drafts came from lookup, from the head
    for temperature in TEMPERATURES:
        for seed in range(2):
            params = xd.SamplingParams(temperature=temperature, seed=seed, **filters)
            head = xd.DraftHead.from_pretrained(head_folder, target, max_draft=4)
            drafter = CountingFallback(PromptLookup(max_draft=6), head)
            generator = xd.Generator(target, drafter, adaptive_depth=adaptive)
            if adaptive:  # fixed pass costs: the policy's choices do not follow machine load
                generator.depth_policy = DepthPolicy([1.0 + 0.1 * w for w in range(7)])
            check.compare(generator, PROMPTS[seed % len(PROMPTS)] * 2, 24, params,
                          serial=serial, stop_tokens=[], label=f"t={temperature} seed {seed}")
            verified = [a + b for a, b in zip(verified, drafter.verified)]
    return check, verified


@pytest.mark.parametrize("filter_name", sorted(FILTERS))
def test_drafted_equals_serial_with_lookup_then_the_head(tiny_targets, llama_head_folder,
                                                         filter_name):
    """Every committed token's logits row has the serial run's bytes, whichever source
    drafted the pass."""
    check, verified = lookup_then_head_runs(tiny_targets["llama"], llama_head_folder,
                                            FILTERS[filter_name], adaptive=False)
    check.assert_exact(min_accepted=3, some_rejected=True)
    assert verified[1] > 0, verified
    # A repetition penalty steers the replies away from the repeats lookup would copy.
    if "repetition_penalty" not in FILTERS[filter_name]:
        assert verified[0] > 0, verified


def test_drafted_equals_serial_with_lookup_then_the_head_at_adaptive_depth(tiny_targets,
                                                                           llama_head_folder):
    check, verified = lookup_then_head_runs(tiny_targets["llama"], llama_head_folder,
                                            FILTERS["plain"], adaptive=True)
    check.assert_exact(min_accepted=3, some_rejected=True)
    assert min(verified) > 0, verified


class Oracle:
    """Proposes the serial run's next tokens, but only after sequences of even length."""

    def __init__(self, serial_sequence, vocab_size, max_draft=6, wrong=False):
        self.serial, self.vocab_size = serial_sequence, vocab_size
        self.max_draft, self.wrong = max_draft, wrong
        self.depths = []

    def begin(self, prompt, context):
        pass

    def propose(self, sequence, limit):
        if not self.wrong and len(sequence) % 2:
            return []
        guesses = self.serial[len(sequence):len(sequence) + limit]
        if self.wrong:
            guesses = [(token + 1) % self.vocab_size for token in guesses]
        return guesses

    def accepted(self, proposed, accepted):
        self.depths.append(proposed)  # the depth that was verified


def oracle_depths(target, single_source: bool) -> list[int]:
    """The depths a right drafter is asked for while it alternates with a wrong one, under fixed
    pass costs (so timing noise cannot move them)."""
    prompt = list(range(40, 60))
    params = xd.SamplingParams(temperature=0.8, seed=3)
    serial = xd.Generator(target).generate(prompt, 80, params, stop_tokens=[])
    sequence = prompt + serial.tokens
    right = Oracle(sequence, target.vocab_size)
    wrong = Oracle(sequence, target.vocab_size, wrong=True)
    drafter = (OnePolicy if single_source else FallbackDrafter)(right, wrong)
    generator = xd.Generator(target, drafter)
    generator.depth_policy = DepthPolicy([1.0 + 0.2 * width for width in range(7)])
    drafted = generator.generate(prompt, 80, params, stop_tokens=[])
    assert drafted.tokens == serial.tokens
    return right.depths


def test_each_source_gets_its_own_depth_policy(tiny_targets):
    """A right drafter alternating with a wrong one keeps being asked for deep drafts: its
    policy sees its own acceptance. Negative control: with one policy for both, the wrong
    drafter's rejections make the right one's depth shallow."""
    target = tiny_targets["llama"]
    own, shared = oracle_depths(target, False), oracle_depths(target, True)
    assert np.mean(own[3:]) >= 5, own
    assert np.mean(shared[3:]) < 4, shared


class BadSource(Recording):
    sources = 2

    def __init__(self, answer):
        super().__init__([3, 4])
        self.answer = answer

    def source(self, sequence):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("answer, kind", [(RuntimeError("no"), "raised"), (7, "not_a_source"),
                                          (True, "not_a_source")])
def test_a_misbehaving_source_costs_nothing(tiny_targets, answer, kind):
    target = tiny_targets["llama"]
    generator = xd.Generator(target, BadSource(answer), adaptive_depth=True)
    params = xd.SamplingParams(temperature=0.7, seed=1)
    with pytest.warns(RuntimeWarning, match=kind):
        drafted = generator.generate(PROMPTS[0], 16, params, stop_tokens=[])
    serial = generator.generate(PROMPTS[0], 16, params, stop_tokens=[], drafts=False)
    assert drafted.tokens == serial.tokens
    assert drafted.stats.drafter_faults.counts.get(kind, 0) > 0
