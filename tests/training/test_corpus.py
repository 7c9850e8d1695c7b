"""The draft vocabulary train-drafter keeps (exactdraft/training/corpus.py): the N tokens most
frequent in the target's replies, ties to the lower id, prompts not counted."""

from __future__ import annotations

import numpy as np

from exactdraft.training.corpus import Example, draft_vocabulary

# Replies count 5: 4, 7: 2, 9: 2, 2: 1, 3: 1; the prompts' 1s (six of them) are not counted.
CORPUS = [Example([1, 1, 1, 5, 5, 7, 9], n_prompt=3),
          Example([1, 1, 1, 5, 2, 9, 5, 7, 3], n_prompt=3)]


def test_the_draft_vocabulary_is_the_most_frequent_reply_tokens():
    for size, expected in ((1, [5]), (2, [5, 7]), (3, [5, 7, 9]), (4, [2, 5, 7, 9]),
                           (5, [2, 3, 5, 7, 9])):
        ids = draft_vocabulary(CORPUS, 16, size)
        assert ids.dtype == np.int64 and ids.tolist() == expected, size
    # Beyond the tokens written: the lowest unwritten ids fill it, then it stops at the
    # vocabulary.
    assert draft_vocabulary(CORPUS, 16, 7).tolist() == [0, 1, 2, 3, 5, 7, 9]
    assert draft_vocabulary(CORPUS, 16, 40).tolist() == list(range(16))
