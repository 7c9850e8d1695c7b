"""SuffixDrafter: longest-match drafting over prompt, output and earlier outputs, bounded."""

from __future__ import annotations

import pytest

import exactdraft as xd
from exactdraft.drafters.suffix import SuffixDrafter


def started(drafter: SuffixDrafter, prompt: list[int]) -> SuffixDrafter:
    drafter.begin(prompt, None)
    return drafter


def test_copies_what_followed_the_match_for_as_long_as_the_match():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 20, 3, 4]
    drafter = started(SuffixDrafter(max_draft=8, min_match=2), prompt)
    # [3, 4] matched (length 2): two tokens proposed.
    assert drafter.propose(prompt, 8) == [5, 6]
    longer = prompt + [5, 6, 7]
    # [3, 4, 5, 6, 7] matched (length 5): five tokens.
    assert drafter.propose(longer, 8) == [8, 9, 10, 11, 20]
    # The limit and max_draft bound it.
    assert drafter.propose(longer, 3) == [8, 9, 10]
    assert started(SuffixDrafter(max_draft=2, min_match=2), prompt).propose(longer, 8) == [8, 9]


def test_speculation_factor_scales_the_length():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
    assert started(SuffixDrafter(min_match=2, speculation_factor=1.0), prompt).propose(
        prompt, 8) == [3, 4]
    assert started(SuffixDrafter(min_match=2, speculation_factor=2.5), prompt).propose(
        prompt, 8) == [3, 4, 5, 6, 7]


def test_the_most_frequent_continuation_wins_and_rare_ones_are_cut():
    # After [7, 8]: 30 three times, 40 once.
    prompt = [7, 8, 30, 1, 7, 8, 40, 2, 7, 8, 30, 3, 7, 8, 30, 4, 7, 8]
    drafter = started(SuffixDrafter(min_match=2, speculation_factor=4.0), prompt)
    assert drafter.propose(prompt, 8)[0] == 30
    # At 30 the branch splits three ways (1, 3, 4): each is 1/4 of the occurrences.
    assert started(SuffixDrafter(min_match=2, speculation_factor=4.0, min_probability=0.3),
                   prompt).propose(prompt, 8) == [30]
    # Equal counts go to the most recent occurrence.
    tie = [7, 8, 30, 1, 7, 8, 40, 2, 7, 8]
    assert started(SuffixDrafter(min_match=2, min_probability=0.0), tie).propose(
        tie, 8) == [40, 2]


def test_earlier_outputs_are_drafted_from_in_a_later_generation():
    drafter = SuffixDrafter(max_draft=6, min_match=2, speculation_factor=3.0)
    drafter.begin([100, 101], None)
    output = [100, 101, 11, 12, 13, 14, 15, 16, 17]
    drafter.propose(output, 6)  # the drafter sees the committed output
    drafter.begin([200, 11, 12], None)  # a new request: the last output is now stored
    assert drafter.stored_tokens == len(output) - 2
    assert drafter.propose([200, 11, 12], 6) == [13, 14, 15, 16, 17]


def test_memory_is_bounded_least_recently_used_first_out():
    drafter = SuffixDrafter(min_match=2, max_stored_tokens=25)
    for base in (10, 20, 30):
        drafter.remember(list(range(base, base + 10)))
    # 30 tokens do not fit in 25: the oldest (10..19) went.
    assert drafter.stored_tokens == 20
    assert drafter.propose([1, 20, 21], 8) == [22, 23]
    assert drafter.propose([1, 10, 11], 8) == []
    # Matching 20..29 made it recent, so the next output pushes out 30..39 instead.
    drafter.remember(list(range(40, 50)))
    assert drafter.propose([1, 20, 21], 8) == [22, 23]
    assert drafter.propose([1, 30, 31], 8) == []
    assert drafter.stored_tokens == 20


def test_index_lists_are_bounded():
    drafter = started(SuffixDrafter(min_match=2, max_candidates=4), [1, 2, 3] * 50)
    assert max(len(positions) for positions in drafter._current.after.values()) == 4


def test_a_sequence_that_is_not_a_continuation_starts_over():
    drafter = started(SuffixDrafter(min_match=2), [1, 2, 3, 4, 1, 2])
    assert drafter.propose([1, 2, 3, 4, 1, 2], 8) == [3, 4]
    assert drafter.propose([9, 8, 7, 9, 8], 8) == [7, 9]


@pytest.mark.parametrize("arguments", [dict(max_draft=0), dict(min_match=0),
                                       dict(max_match=1, min_match=2),
                                       dict(speculation_factor=0), dict(min_probability=1.5),
                                       dict(max_stored_tokens=-1), dict(max_candidates=True)])
def test_bad_arguments_are_refused(arguments):
    with pytest.raises(ValueError, match=next(iter(arguments))):
        SuffixDrafter(**arguments)


def test_drafts_across_requests_on_a_model(tiny_targets):
    """A repeated request is drafted from the first one's output: most of it in few passes,
    with the serial tokens."""
    target = tiny_targets["llama"]
    params = xd.SamplingParams(temperature=0.0)
    prompt = [3, 17, 99, 3, 17]
    serial = xd.Generator(target, stop_tokens=[]).generate(prompt, 40, params, drafts=False)
    generator = xd.Generator(target, SuffixDrafter(max_draft=8, speculation_factor=4.0),
                             stop_tokens=[], adaptive_depth=False)
    first = generator.generate(prompt, 40, params)
    second = generator.generate(prompt, 40, params)
    assert first.tokens == second.tokens == serial.tokens
    assert second.stats.accepted > first.stats.accepted
    assert second.stats.target_passes < first.stats.target_passes


def test_a_tree_holds_the_alternatives_most_frequent_first():
    # After [7, 8]: 30 three times (then 4, 3, 1: most recent first), 40 once (then 2).
    prompt = [7, 8, 30, 1, 7, 8, 40, 2, 7, 8, 30, 3, 7, 8, 30, 4, 7, 8]
    drafter = started(SuffixDrafter(min_match=2, speculation_factor=4.0, tree_width=3,
                                    min_probability=0.0), prompt)
    tree = drafter.propose(prompt, 8)
    assert isinstance(tree, xd.DraftTree)
    assert tree.tokens[:2] == (30, 40) and tree.parents[:2] == (-1, -1)
    assert tree.first_path()[:2] == [30, 4]
    children_of_30 = [t for t, p in zip(tree.tokens, tree.parents) if p == 0]
    assert children_of_30 == [4, 3, 1]
    assert len(tree) <= 8
    # tree_width 1 is the chain along the first path (which the tree's 8 nodes cut short).
    chain = started(SuffixDrafter(min_match=2, speculation_factor=4.0, min_probability=0.0),
                    prompt).propose(prompt, 8)
    assert chain == [30, 4, 7, 8]
    assert tree.first_path() == chain[:len(tree.first_path())]
    # The width bounds the alternatives per node.
    narrow = started(SuffixDrafter(min_match=2, speculation_factor=4.0, tree_width=2,
                                   min_probability=0.0), prompt).propose(prompt, 8)
    assert [t for t, p in zip(narrow.tokens, narrow.parents) if p == 0] == [4, 3]
