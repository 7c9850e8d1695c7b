"""Token trees on deepseek_v3 (latent attention: the tree's rows share one cache of latents)
and glm4_moe: every tree row has the bits of serial steps over its own path, committing a path
leaves the cache a serial run leaves, and drafted == serial with a tree drafter; the negative
control feeds the same tokens as a chain, whose rows off the first path differ."""

from __future__ import annotations

import pytest

import exactdraft as xd
from exactdraft.guard import probe_tokens
from tests.models.families.test_deepseek_v3 import DEEPSEEK_V3, build_checkpoint, load
from tests.models.families.test_glm4_moe import GLM4_MOE
from tests.models.test_token_tree import SHAPES, path_to, serial_rows

FAMILIES = {"deepseek_v3": DEEPSEEK_V3, "glm4_moe": GLM4_MOE}


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    return {name: load(build_checkpoint(str(tmp_path_factory.mktemp(name)), settings))
            for name, settings in FAMILIES.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_tree_rows_and_commits_equal_serial_steps(family, targets):
    target = targets[family]
    assert target.supports_trees
    prefix = probe_tokens(target.key_block - 3, target.vocab_size, salt=1)  # rows cross a block
    for salt, parents in enumerate(SHAPES.values()):
        tokens = probe_tokens(len(parents), target.vocab_size, salt=10 + salt)
        expected = serial_rows(target, prefix, tokens, parents)
        state = target.new_state()
        target.forward(state, prefix)
        assert [row.tobytes() for row in target.forward_tree(state, tokens, parents)] == expected
        # Keep the path to the deepest row: the next step is the serial run's.
        path = path_to(parents, len(parents) - 1)
        target.commit_tree(state, path)
        serial = target.new_state()
        target.forward(serial, prefix + [tokens[node] for node in path])
        assert target.forward(state, [7, 8], rows="all").tobytes() == \
            target.forward(serial, [7, 8], rows="all").tobytes()


@pytest.mark.parametrize("family", FAMILIES)
def test_negative_control_a_chain_differs_off_the_first_path(family, targets):
    """The tree's tokens as a chain (each row seeing every row before it): only the rows
    whose path is the chain's own prefix keep their bits."""
    target = targets[family]
    parents = SHAPES["bushy"]
    prefix = probe_tokens(30, target.vocab_size, salt=4)
    tokens = probe_tokens(len(parents), target.vocab_size, salt=5)
    expected = serial_rows(target, prefix, tokens, parents)
    chain = target.forward(target.new_state(), prefix + tokens, rows="all")[len(prefix):]
    on_the_chain = [path_to(parents, row) == list(range(row + 1)) for row in range(len(tokens))]
    assert [row.tobytes() == want for row, want in zip(chain, expected)] == on_the_chain
    assert on_the_chain.count(False) >= 8


@pytest.mark.parametrize("family", FAMILIES)
def test_drafted_equals_serial_with_token_trees(family, targets):
    """Oracle trees (the serial continuation on one branch, wrong siblings beside it) at
    T=0.8: tree passes run, paths are kept, and every token and logits row is serial's."""
    from tests.exactness import ExactnessCheck
    from tests.test_tree_generation import OracleTreeDrafter

    target = targets[family]
    serial = xd.Generator(target)
    prompt = [5, 6, 7, 8, 9, 5, 6]
    check, tree_passes = ExactnessCheck(), 0
    for seed in range(3):
        params = xd.SamplingParams(temperature=0.8, seed=seed)
        expected = serial.generate(prompt, 24, params, stop_tokens=[])
        trees = xd.Generator(target, OracleTreeDrafter(expected.tokens, len(prompt), seed),
                             adaptive_depth=False, strict=True)
        drafted, _ = check.compare(trees, prompt, 24, params, serial=serial, stop_tokens=[])
        tree_passes += drafted.stats.tree_passes
    check.assert_exact(min_accepted=10, some_rejected=True)
    assert tree_passes > 0
