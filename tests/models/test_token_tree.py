"""Token trees in one pass: every tree row has the bits of a serial step over its own path, and
committing a path leaves the cache a serial run over it would leave; on every family, fused and
per-op, across a key-block boundary. The negative control runs the same tokens as a chain (each
row attending to all rows before it), which is what a backend without tree attention would
compute: the rows of every branch off the first path then differ."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.errors import ParameterError
from exactdraft.guard import probe_tokens
from exactdraft.kernels import cpu
from exactdraft.models.token_tree import tree_rows
from tests.conftest import VARIANTS

# (parents): a root with two branches, a bushy tree, and a chain written as a tree.
SHAPES = {
    "two-branches": [-1, 0, 0, 1, 2, 3, 4],
    "bushy": [-1, 0, 0, 0, 1, 1, 2, 4, 4, 7, 3, 10],
    "chain": [-1, 0, 1, 2, 3],
}


def path_to(parents: list[int], row: int) -> list[int]:
    path = [row]
    while parents[path[-1]] != -1:
        path.append(parents[path[-1]])
    return path[::-1]


def serial_rows(target, prefix, tokens, parents) -> list[bytes]:
    """For each tree row, the logits of serial one-token steps over its path, from the prefix."""
    rows = []
    for row in range(len(tokens)):
        state = target.new_state()
        target.forward(state, prefix)
        for node in path_to(parents, row):
            logits = target.forward(state, [tokens[node]])
        rows.append(logits[0].tobytes())
    return rows


@pytest.fixture(scope="module")
def cpu_targets(tiny_checkpoints):
    """(variant, fused) -> model on the C-kernel backend."""
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.pretrained import build_target, load_checkpoint

    built = {}

    def get(variant: str, fused: bool):
        if (variant, fused) not in built:
            built[variant, fused] = build_target(load_checkpoint(tiny_checkpoints[variant]),
                                                 TorchCPUBackend(fused_layers=fused))
        return built[variant, fused]

    return get


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-op"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tree_rows_equal_serial_steps_over_their_paths(cpu_targets, variant, fused):
    target = cpu_targets(variant, fused)
    assert target.supports_trees
    # The prefix ends 3 positions before a key-block boundary, so deep rows cross it.
    prefix = probe_tokens(target.key_block - 3, target.vocab_size, salt=1)
    for salt, (name, parents) in enumerate(SHAPES.items()):
        tokens = probe_tokens(len(parents), target.vocab_size, salt=10 + salt)
        state = target.new_state()
        target.forward(state, prefix)
        tree = target.forward_tree(state, tokens, parents)
        expected = serial_rows(target, prefix, tokens, parents)
        assert [row.tobytes() for row in tree] == expected, name


@pytest.mark.parametrize("variant", ["llama", "qwen2-window", "gemma3"])
def test_committing_a_path_leaves_the_serial_cache(cpu_targets, variant):
    target = cpu_targets(variant, True)
    parents = SHAPES["bushy"]
    prefix = probe_tokens(40, target.vocab_size, salt=2)
    tokens = probe_tokens(len(parents), target.vocab_size, salt=3)
    for leaf in (11, 8, 5):
        path = path_to(parents, leaf)
        state = target.new_state()
        target.forward(state, prefix)
        target.forward_tree(state, tokens, parents)
        target.commit_tree(state, path)
        assert state.length == len(prefix) + len(path)
        after = target.forward(state, [7, 8, 9], rows="all")
        serial = target.new_state()
        target.forward(serial, prefix)
        for node in path:
            target.forward(serial, [tokens[node]])
        assert after.tobytes() == target.forward(serial, [7, 8, 9], rows="all").tobytes()


def test_negative_control_the_same_tokens_as_a_chain_differ_off_the_first_path(cpu_targets):
    target = cpu_targets("llama", True)
    parents = SHAPES["two-branches"]
    prefix = probe_tokens(30, target.vocab_size, salt=4)
    tokens = probe_tokens(len(parents), target.vocab_size, salt=5)
    expected = serial_rows(target, prefix, tokens, parents)
    state = target.new_state()
    target.forward(state, prefix)
    chain = target.forward(state, tokens, rows="all")
    same = [chain[row].tobytes() == expected[row] for row in range(len(tokens))]
    # Rows 0 and 1 head the first path, which the chain reproduces; every other row sees a
    # sibling or a cousin it should not see.
    assert same[:2] == [True, True]
    assert not any(same[2:]), same


def test_tree_rows_are_checked():
    with pytest.raises(ParameterError, match="root"):
        tree_rows([0, 0])
    with pytest.raises(ParameterError, match="row 2: parent must be an earlier row"):
        tree_rows([-1, 0, 2])
    depths, paths = tree_rows([-1, 0, 0, 2])
    assert depths.tolist() == [0, 1, 1, 2]
    assert paths[3, :3].tolist() == [0, 2, 3]


def test_bad_commits_and_backends_without_trees_are_refused(cpu_targets, tiny_checkpoints):
    target = cpu_targets("llama", True)
    state = target.new_state()
    target.forward(state, [1, 2, 3])
    with pytest.raises(ParameterError, match="forward_tree pass first"):
        target.commit_tree(state, [0])
    target.forward_tree(state, [4, 5, 6], [-1, 0, 0])
    with pytest.raises(ParameterError, match="not a child of row 1"):
        target.commit_tree(state, [0, 1, 2])
    with pytest.raises(ParameterError, match="one parent per token"):
        target.forward_tree(target.new_state(), [4, 5], [-1])
    from exactdraft.pretrained import build_target, load_checkpoint

    padded = build_target(load_checkpoint(tiny_checkpoints["llama"]), "torch-padded")
    assert not padded.supports_trees
    with pytest.raises(ParameterError, match="no tree attention"):
        padded.forward_tree(padded.new_state(), [4, 5], [-1, 0])


def test_kernel_refuses_paths_outside_the_tree():
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((1, 64, 16)).astype(np.float32)
    q = rng.standard_normal((3, 2, 16)).astype(np.float32)
    positions = np.array([10, 11, 11])
    good = np.array([[0, 0, 0], [0, 1, 0], [0, 2, 0]], dtype=np.int32)
    cpu.attention(q, keys, keys, positions, 0, 0.25, tree_paths=good)
    bad = good.copy()
    bad[2, 0] = 5  # an ancestor row that is not in the pass
    with pytest.raises(ValueError, match="tree row 2"):
        cpu.attention(q, keys, keys, positions, 0, 0.25, tree_paths=bad)
    with pytest.raises(ValueError, match="tree row 1"):
        cpu.attention(q, keys, keys, np.array([10, 12, 11]), 0, 0.25, tree_paths=good)
