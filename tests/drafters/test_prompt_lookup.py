"""PromptLookup proposals: longest earlier match, latest occurrence, limits."""

from __future__ import annotations

import pytest

from exactdraft.drafters import DraftTree, PromptLookup


def proposals(drafter, sequence, limit=8):
    drafter.begin(sequence, None)
    return drafter.propose(sequence, limit)


def test_copies_what_followed_the_latest_occurrence():
    drafter = PromptLookup(max_draft=4, min_match=2)
    sequence = [1, 2, 3, 9, 9, 1, 2, 3, 7, 7, 8, 1, 2, 3]
    assert proposals(drafter, sequence) == [7, 7, 8, 1]


def test_prefers_the_longest_match():
    drafter = PromptLookup(max_draft=3, min_match=1, max_match=4)
    # "3" alone last occurred before 5, but "2 3" occurred before 4.
    sequence = [2, 3, 4, 4, 3, 5, 2, 3]
    assert proposals(drafter, sequence) == [4, 4, 3]


def test_no_match_means_no_drafts():
    drafter = PromptLookup(min_match=2)
    assert proposals(drafter, [1, 2, 3, 4, 5]) == []


def test_limit_and_max_draft_bound_the_proposal():
    drafter = PromptLookup(max_draft=2, min_match=1)
    sequence = [1, 2, 3, 4, 5, 6, 1]
    assert proposals(drafter, sequence, limit=8) == [2, 3]
    assert proposals(drafter, sequence, limit=1) == [2]
    assert proposals(drafter, sequence, limit=0) == []


def test_index_grows_with_the_sequence():
    drafter = PromptLookup(max_draft=3, min_match=2)
    sequence = [4, 5, 6, 1, 2]
    drafter.begin(sequence, None)
    assert drafter.propose(sequence, 3) == []
    sequence += [6, 4, 5]
    assert drafter.propose(sequence, 3) == [6, 1, 2]
    # A new, shorter sequence resets the index.
    assert drafter.propose([9, 9, 9], 3) == [9]


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_draft=0), "max_draft"), (dict(min_match=0), "min_match"),
    (dict(min_match=3, max_match=2), "max_match"), (dict(max_draft=True), "max_draft"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PromptLookup(**kwargs)


def test_tree_width_proposes_the_continuations_of_several_occurrences():
    sequence = [1, 2, 10, 11, 1, 2, 20, 21, 1, 2, 10, 12, 1, 2]
    chain = PromptLookup(max_draft=4, min_match=2)
    chain.begin(sequence, None)
    # A chain copies the latest occurrence only.
    assert chain.propose(sequence, 4) == [10, 12, 1, 2]
    tree = PromptLookup(max_draft=4, min_match=2, tree_width=2)
    tree.begin(sequence, None)
    proposal = tree.propose(sequence, 4)
    assert isinstance(proposal, DraftTree) and len(proposal) == 4
    # 10 follows [1, 2] twice, 20 once: 10 first; below 10 the latest (12) first.
    assert proposal.tokens[0] == 10 and proposal.parents[0] == -1
    assert proposal.first_path()[:2] == [10, 12]
    assert 20 in proposal.tokens
    with pytest.raises(ValueError, match="tree_width"):
        PromptLookup(tree_width=0)
