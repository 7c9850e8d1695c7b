"""The C attention kernel with sinks (a logit per query head in every row's softmax denominator,
no value), at every SIMD level this CPU runs and the emulated ones: within float32 rounding of the
float64 softmax over [scores, sink]; a row's bits alone equal its bits inside a multi-row pass
(every row count 1..16 and 70, windows, 1 and 2 threads, a larger buffer with other contents),
a chunked prefill equals one pass, token-tree rows equal serial steps over their paths, and
every level gives the scalar level's bits. Controls: the sink dropped or given to another head
misses the reference; torch's scaled_dot_product_attention with the sink as a key of zero value
(the same function) gives rows other bits when the row count changes. A sink merged after the
keys instead of before them is caught by tests/kernels/test_cpu_levels.py."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.kernels import cpu
from tests.kernels.conftest import bits

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

LEVELS = (cpu.simd_levels() + cpu.emulated_simd_levels()) if cpu.available() else ()
# conftest's `level` fixture over these levels: the emulated ones too.
every_level = pytest.mark.parametrize("level", LEVELS, indirect=True)
HEADS, KV_HEADS = 6, 2


def problem(seed: int, capacity: int, head_dim: int, rows: int):
    """(q [rows, 6, D], keys, values [2, capacity, D], sinks [6]); sinks inside the scores'
    range and beyond it both ways."""
    rng = np.random.default_rng(seed)
    keys, values = (rng.standard_normal((KV_HEADS, capacity, head_dim)).astype(np.float32)
                    for _ in range(2))
    q = rng.standard_normal((rows, HEADS, head_dim)).astype(np.float32)
    sinks = np.array([-4.0, 0.0, 1.5, 3.0, -0.5, 12.0], np.float32)
    return q, keys, values, sinks


def sink_reference(q, keys, values, positions, window, scale, sinks) -> np.ndarray:
    """softmax([scores, sink]) times [values, 0] in float64, row by row and head by head."""
    group = q.shape[1] // keys.shape[0]
    out = np.zeros(q.shape)
    for m, position in enumerate(positions):
        first = max(0, position - window + 1) if window > 0 else 0
        for h in range(q.shape[1]):
            k = keys[h // group, first:position + 1].astype(np.float64)
            v = values[h // group, first:position + 1].astype(np.float64)
            logits = np.append(k @ q[m, h].astype(np.float64) * scale, float(sinks[h]))
            weights = np.exp(logits - logits.max())
            out[m, h] = weights[:-1] @ v / weights.sum()
    return out


@every_level
@pytest.mark.parametrize("head_dim,window", [(64, 0), (64, 50), (40, 0), (128, 70)])
def test_sinks_match_the_float64_softmax(level, head_dim, window):
    q, keys, values, sinks = problem(1, 300, head_dim, 6)
    positions = np.array([0, 63, 64, 130, 250, 299])
    scale = head_dim**-0.5
    out = cpu.attention(q, keys, values, positions, window, scale, sinks=sinks)
    reference = sink_reference(q, keys, values, positions, window, scale, sinks)
    assert np.abs(out - reference).max() < 2e-6
    # Controls: the sink dropped, or each head given its neighbour's, is far from it.
    dropped = cpu.attention(q, keys, values, positions, window, scale)
    assert np.abs(dropped - reference).max() > 1e-2
    moved = cpu.attention(q, keys, values, positions, window, scale,
                          sinks=np.roll(sinks, 1))
    assert np.abs(moved - reference).max() > 1e-2


@every_level
@pytest.mark.parametrize("window", (0, 50, 64))
@pytest.mark.parametrize("threads", (1, 2))
@pytest.mark.parametrize("head_dim", (40, 64, 128))  # the general kernel and both fixed sizes
def test_a_row_with_sinks_has_its_bits_alone_in_any_pass(level, window, threads, head_dim,
                                                         restore_threads):
    cpu.set_num_threads(threads)
    q_all, keys, values, sinks = problem(2, 256, head_dim, 70)
    rng = np.random.default_rng(3)
    grown_keys, grown_values = (rng.standard_normal((KV_HEADS, 512, head_dim)).astype(
        np.float32) for _ in range(2))  # other contents past 255
    grown_keys[:, :256], grown_values[:, :256] = keys, values
    scale = head_dim**-0.5
    for rows in (*range(1, 17), 70):
        q = q_all[:rows]
        positions = np.sort(rng.choice(256, size=rows, replace=False))
        together = bits(cpu.attention(q, keys, values, positions, window, scale, sinks=sinks))
        grown = bits(cpu.attention(q, grown_keys, grown_values, positions, window, scale,
                                   sinks=sinks))
        assert np.array_equal(together, grown), rows
        for r in range(rows):
            alone = cpu.attention(q[r:r + 1], keys, values, positions[r:r + 1], window, scale,
                                  sinks=sinks)
            assert np.array_equal(together[r:r + 1], bits(alone)), (rows, r)


def test_a_chunked_prefill_with_sinks_equals_one_pass():
    q, keys, values, sinks = problem(4, 256, 64, 200)
    positions = np.arange(200)
    whole = bits(cpu.attention(q, keys, values, positions, 0, 0.125, sinks=sinks))
    cuts = (0, 1, 37, 64, 130, 200)
    chunks = [cpu.attention(q[a:b], keys, values, positions[a:b], 0, 0.125, sinks=sinks)
              for a, b in zip(cuts, cuts[1:])]
    assert np.array_equal(whole, bits(np.concatenate(chunks)))


PARENTS = [-1, 0, 0, 1, 2, 3, 4, 1]  # two branches and a sibling; base 60 crosses the tile at 64


@every_level
def test_tree_rows_with_sinks_equal_serial_steps_over_their_paths(level):
    """Row r of a token tree at base 60 (its slot 60 + r, position 60 + its depth) against
    one row over a buffer that holds its path's keys at the positions they stand for."""
    base = 60
    q, keys, values, sinks = problem(5, 128, 64, len(PARENTS))
    paths = np.zeros((len(PARENTS), len(PARENTS)), np.int32)
    depths = []
    for row in range(len(PARENTS)):
        path = [row]
        while PARENTS[path[-1]] != -1:
            path.append(PARENTS[path[-1]])
        path.reverse()
        paths[row, :len(path)] = path
        depths.append(len(path) - 1)
    positions = base + np.array(depths)
    tree = bits(cpu.attention(q, keys, values, positions, 0, 0.125, tree_paths=paths,
                              sinks=sinks))
    for row, depth in enumerate(depths):
        serial_keys, serial_values = keys.copy(), values.copy()
        slots = base + paths[row, :depth + 1]
        serial_keys[:, base:base + depth + 1] = keys[:, slots]
        serial_values[:, base:base + depth + 1] = values[:, slots]
        serial = cpu.attention(q[row:row + 1], serial_keys, serial_values, positions[row:row + 1],
                               0, 0.125, sinks=sinks)
        assert np.array_equal(tree[row:row + 1], bits(serial)), row


def test_every_level_gives_the_scalar_bits_with_sinks():
    q, keys, values, sinks = problem(6, 300, 64, 9)
    positions = np.array([0, 5, 63, 64, 65, 128, 200, 298, 299])
    default, outputs = cpu.simd_level(), {}
    try:
        for level in LEVELS:
            cpu.set_simd_level(level)
            outputs[level] = bits(cpu.attention(q, keys, values, positions, 40, 0.125,
                                                sinks=sinks))
    finally:
        cpu.set_simd_level(default)
    assert "scalar" in outputs
    assert all(np.array_equal(out, outputs["scalar"]) for out in outputs.values())


def test_negative_control_sdpa_with_the_sink_as_a_key_breaks_row_invariance():
    """torch's scaled_dot_product_attention with the sink as one more key (a zero key whose
    additive mask is the head's sink, and a zero value): the same function, close to the
    reference, but a row's bits change with the row count, so the comparison above can fail."""
    torch = pytest.importorskip("torch")
    q, keys, values, sinks = problem(7, 100, 64, 16)
    group = HEADS // KV_HEADS
    padded_keys, padded_values = (torch.from_numpy(np.concatenate(
        [np.zeros((HEADS, 1, 64), np.float32), np.repeat(buffer, group, 0)], 1))[None]
        for buffer in (keys, values))
    positions = np.arange(84, 100)

    def sdpa(rows: slice) -> torch.Tensor:
        visible = np.arange(100)[None, :] <= positions[rows, None]
        bias = np.where(visible, 0.0, -np.inf).astype(np.float32)
        bias = np.concatenate([np.zeros((bias.shape[0], 1), np.float32), bias], 1)
        mask = np.repeat(bias[None], HEADS, 0)
        mask[:, :, 0] = sinks[:, None]
        query = torch.from_numpy(np.ascontiguousarray(q[rows].transpose(1, 0, 2)))[None]
        out = torch.nn.functional.scaled_dot_product_attention(
            query, padded_keys, padded_values, torch.from_numpy(mask)[None], scale=0.125)
        return out[0].transpose(0, 1)

    reference = sink_reference(q, keys, values, positions, 0, 0.125, sinks)
    assert np.abs(sdpa(slice(None)).numpy() - reference).max() < 1e-5
    broken = 0
    for rows in (2, 5, 16):
        together = sdpa(slice(0, rows))
        broken += sum(not torch.equal(sdpa(slice(r, r + 1)), together[r:r + 1])
                      for r in range(rows))
    assert broken > 0


@pytest.mark.parametrize("sinks,error,match", [
    (np.zeros(5, np.float32), ValueError, "sinks"),
    (np.zeros(6, np.float64), TypeError, "sinks must have dtype float32"),
    (np.array([0, 0, np.inf, 0, 0, 0], np.float32), ValueError, "sinks must be finite"),
])
def test_bad_sinks_are_refused(sinks, error, match):
    q, keys, values, _ = problem(8, 64, 64, 2)
    with pytest.raises(error, match=match):
        cpu.attention(q, keys, values, np.array([3, 4]), 0, 0.125, sinks=sinks)
