"""A misbehaving drafter costs at most the pass it misbehaves in, never a token.

Each drafter below wraps a good one (an oracle that knows the serial continuation, so most
passes keep drafts) and misbehaves on some passes: it raises, proposes ids outside the
vocabulary, non-integers, more tokens than asked, or something that is not a list. The drafted
run must write the serial run's tokens (compared with the bytes of every row by ExactnessCheck),
keep drafts on the good passes, and count each misbehaviour by kind in the stats. The negative
control shows the premise: handed to the verifier unchecked, the out-of-vocabulary draft aborts
the pass.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.drafters.checked import (
    NOT_A_SEQUENCE,
    NOT_A_TOKEN,
    OUT_OF_VOCABULARY,
    RAISED,
    TOO_MANY,
    CheckedDrafter,
)
from exactdraft.models.target import Pass, PassSequence, run_pass
from tests.exactness import ExactnessCheck, OracleDrafter

PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
LENGTH = 40


class Misbehaving(OracleDrafter):
    """An oracle drafter that misbehaves (in the way `kind` names) on every third pass."""

    def __init__(self, continuation: list[int], kind: str, vocab_size: int) -> None:
        super().__init__(continuation, max_draft=4, error_rate=0.0, seed=0)
        self.kind, self.vocab_size, self.passes = kind, vocab_size, 0

    def __repr__(self) -> str:
        return f"Misbehaving({self.kind})"

    def propose(self, sequence, limit):
        good = super().propose(sequence, limit)
        self.passes += 1
        if self.passes % 3:
            return good
        if self.kind == RAISED:
            raise RuntimeError("drafter bug")
        if self.kind == OUT_OF_VOCABULARY:
            return [*good[:1], self.vocab_size + 7, *good[1:]]
        if self.kind == "negative":
            return [-1, *good]
        if self.kind == NOT_A_TOKEN:
            return [*good[:1], 2.5]
        if self.kind == TOO_MANY:
            return good + [1] * (limit + 5)
        if self.kind == "endless":
            return iter(lambda: 1, None)  # an endless iterator: must not hang the run
        if self.kind == NOT_A_SEQUENCE:
            return None
        if self.kind == "mutates":
            if isinstance(sequence, list):
                sequence.append(3)
            return good
        raise AssertionError(self.kind)

    def accepted(self, proposed, accepted):
        if self.kind == "feedback":
            raise ValueError("feedback bug")


KINDS = {RAISED: RAISED, OUT_OF_VOCABULARY: OUT_OF_VOCABULARY, "negative": OUT_OF_VOCABULARY,
         NOT_A_TOKEN: NOT_A_TOKEN, TOO_MANY: TOO_MANY, "endless": TOO_MANY,
         NOT_A_SEQUENCE: NOT_A_SEQUENCE, "feedback": RAISED, "mutates": None}


@pytest.fixture(scope="module")
def target(tiny_targets):
    return tiny_targets["llama-tied"]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("kind", list(KINDS))
def test_misbehaving_drafter_leaves_output_unchanged(target, kind, temperature):
    params = xd.SamplingParams(temperature=temperature, seed=3)
    serial = xd.Generator(target, sampling=params, stop_tokens=[]).generate(
        PROMPT, LENGTH, drafts=False)
    drafter = Misbehaving(serial.tokens, kind, target.vocab_size)
    generator = xd.Generator(target, drafter, sampling=params, stop_tokens=[],
                             adaptive_depth=False)
    check = ExactnessCheck()
    if KINDS[kind] is None:
        drafted, _ = check.compare(generator, PROMPT, LENGTH, params, stop_tokens=[])
    else:
        with pytest.warns(RuntimeWarning, match=rf"drafter Misbehaving\({kind}\) misbehaved"):
            drafted, _ = check.compare(generator, PROMPT, LENGTH, params, stop_tokens=[])
    check.assert_exact(min_accepted=LENGTH // 2)
    assert drafted.tokens == serial.tokens
    faults = drafted.stats.drafter_faults
    assert faults.drafter == f"Misbehaving({kind})"
    if KINDS[kind] is None:
        assert not faults, faults
    else:
        assert set(faults.counts) == {KINDS[kind]}, faults.counts
        # Every third pass misbehaved (every pass, for feedback).
        assert faults.total >= drafter.passes // 3 >= 2, (faults.counts, drafter.passes)
    # The Generator stays usable and the next run starts with clean counts.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        again = generator.generate(PROMPT, 5, params, stop_tokens=[])
    assert again.tokens == serial.tokens[:5]


def test_begin_raising_turns_drafting_off_for_that_run(target):
    class BadBegin(OracleDrafter):
        def begin(self, prompt, context):
            raise KeyError("no index")

    params = xd.SamplingParams(temperature=0.0)
    serial = xd.Generator(target, stop_tokens=[]).generate(PROMPT, 12, params, drafts=False)
    generator = xd.Generator(target, BadBegin(serial.tokens, 4, 0.0, 0), stop_tokens=[])
    with pytest.warns(RuntimeWarning, match="begin\\(\\) raised KeyError"):
        drafted = generator.generate(PROMPT, 12, params)
    assert drafted.tokens == serial.tokens
    assert drafted.stats.drafted == 0
    assert drafted.stats.drafter_faults.counts == {RAISED: 1}


def test_checked_drafter_keeps_the_valid_prefix():
    class Fixed:
        max_draft = 8

        def __init__(self, proposal):
            self.proposal = proposal

        def begin(self, prompt, context):
            pass

        def propose(self, sequence, limit):
            return self.proposal

        def accepted(self, proposed, accepted):
            pass

    cases = [
        ([1, 2, 3], 8, [1, 2, 3], {}),
        ([np.int64(4), np.int32(5)], 8, [4, 5], {}),
        ([1, 2, 99, 3], 8, [1, 2], {OUT_OF_VOCABULARY: 1}),
        ([1, True, 3], 8, [1], {NOT_A_TOKEN: 1}),
        ([1, "2"], 8, [1], {NOT_A_TOKEN: 1}),
        ([1, 2, 3, 4], 2, [1, 2], {TOO_MANY: 1}),
        ("12", 8, [], {NOT_A_SEQUENCE: 1}),
        (7, 8, [], {NOT_A_SEQUENCE: 1}),
    ]
    for proposal, limit, expected, counts in cases:
        checked = CheckedDrafter(Fixed(proposal), vocab_size=50, max_draft=8)
        with pytest.warns(RuntimeWarning) if counts else _no_warning():
            assert checked.propose((0, 1), limit) == expected, proposal
        assert checked.faults.counts == counts, proposal


def test_negative_control_an_unchecked_out_of_vocabulary_draft_aborts_the_pass(target):
    state = target.new_state()
    target.forward(state, PROMPT[:-1])
    verify_pass = Pass([PassSequence(state, [PROMPT[-1], target.vocab_size + 7])], "all")
    with pytest.raises(xd.ParameterError, match=str(target.vocab_size + 7)):
        run_pass(target, verify_pass)


class _no_warning:
    def __enter__(self):
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error", RuntimeWarning)

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


def test_checked_drafter_keeps_the_valid_part_of_a_tree():
    class Fixed:
        max_draft = 8

        def __init__(self, proposal):
            self.proposal = proposal

        def begin(self, prompt, context):
            pass

        def propose(self, sequence, limit):
            return self.proposal

        def accepted(self, proposed, accepted):
            pass

    # Node 1 (99) is out of the vocabulary: it and its child (node 3) go; node 4's parent
    # (node 2) moves up one place.
    tree = xd.DraftTree((1, 99, 2, 3, 4, 6), (-1, -1, 0, 1, 2, -1))
    checked = CheckedDrafter(Fixed(tree), vocab_size=50, max_draft=8, trees=True)
    with pytest.warns(RuntimeWarning, match="tree node 1"):
        kept = checked.propose((0,), 8)
    assert kept == xd.DraftTree((1, 2, 4, 6), (-1, 0, 1, -1))
    assert checked.faults.counts == {OUT_OF_VOCABULARY: 1}
    # Cut to the limit, parents first.
    checked = CheckedDrafter(Fixed(xd.DraftTree((1, 5, 2, 3), (-1, -1, 0, 2))), 50, 8, True)
    with pytest.warns(RuntimeWarning, match="tree of 4 nodes"):
        assert checked.propose((0,), 3) == xd.DraftTree((1, 5, 2), (-1, -1, 0))
    # What is left a chain goes as a chain; where trees cannot be verified, the first path.
    checked = CheckedDrafter(Fixed(xd.DraftTree((1, 99, 2), (-1, -1, 0))), 50, 8, True)
    with pytest.warns(RuntimeWarning, match="tree node 1"):
        assert checked.propose((0,), 8) == [1, 2]
    checked = CheckedDrafter(Fixed(xd.DraftTree((1, 5, 2, 3), (-1, -1, 0, 2))), 50, 8, False)
    assert checked.propose((0,), 8) == [1, 2, 3]
    assert not checked.faults
