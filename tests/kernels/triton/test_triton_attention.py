"""The Triton attention under the interpreter: accuracy against float64, bitwise invariance over
row count, row grouping, cache capacity, stale cache contents, windows and chunk boundaries."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("triton", reason="the Triton kernel tests need the triton package")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from exactdraft.kernels.triton.attention import (  # noqa: E402
    CHUNK,
    AttentionConfig,
    attention,
)
from exactdraft.kernels.triton.launch import KernelError  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HEADS, KV_HEADS, HEAD_DIM = 6, 2, 16  # three query heads per KV head: a padded group
SCALE = 1.0 / math.sqrt(HEAD_DIM)
# Small chunks and tiles keep the interpreter quick while crossing many chunk boundaries.
SMALL = AttentionConfig(block_m=4, group=4, chunk=16, tile=8)


def make_cache(capacity: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(KV_HEADS, capacity, HEAD_DIM, generator=generator)
    values = torch.randn(KV_HEADS, capacity, HEAD_DIM, generator=generator)
    return keys.to(dtype), values.to(dtype)


def make_queries(count: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(count, HEADS, HEAD_DIM, generator=generator) * 2).to(dtype)


def reference(q, keys, values, positions, window):
    group = HEADS // KV_HEADS
    out = torch.zeros(q.shape, dtype=torch.float64)
    for row, position in enumerate(positions.tolist()):
        first = max(0, position - window + 1) if window else 0
        for head in range(HEADS):
            k = keys[head // group, first:position + 1].double()
            v = values[head // group, first:position + 1].double()
            weights = torch.softmax(k @ q[row, head].double() * SCALE, dim=0)
            out[row, head] = weights @ v
    return out


def run(q, keys, values, positions, window=0, config=SMALL, **options):
    return attention(q, keys, values, positions, SCALE, window, config=config, **options)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window", [0, 300])
def test_matches_float64_reference_with_the_default_chunks(dtype, window):
    keys, values = make_cache(1024, dtype, seed=1)
    positions = torch.tensor([0, 5, 63, 64, 511, 512, 700, 1000])
    q = make_queries(len(positions), dtype, seed=2)
    out = attention(q, keys, values, positions, SCALE, window)
    assert out.dtype == dtype and out.shape == q.shape
    exact = reference(q, keys, values, positions, window)
    unit = {torch.float32: 1e-6, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-9}[dtype]
    assert ((out.double() - exact).abs() <= unit * (1 + exact.abs())).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16,
                                   pytest.param(torch.float16, marks=pytest.mark.slow)], ids=str)
def test_rows_are_bitwise_invariant_across_chunk_boundaries(dtype, same_bits):
    """A W-row verify pass at positions p..p+W-1 gives each row its one-row decode bits."""
    keys, values = make_cache(48, dtype, seed=3)
    positions = torch.arange(10, 34)  # crosses chunk boundaries at 16 and 32
    q = make_queries(len(positions), dtype, seed=4)
    singles = torch.cat([run(q[i:i + 1], keys, values, positions[i:i + 1])
                         for i in range(len(positions))])
    for start, count in [(0, c) for c in range(1, 17)] + [(3, 5), (5, 16), (0, 24)]:
        batch = run(q[start:start + count], keys, values, positions[start:start + count])
        assert same_bits(batch, singles[start:start + count]), (start, count)


def test_windowed_rows_are_bitwise_invariant(same_bits):
    keys, values = make_cache(64, torch.float32, seed=5)
    positions = torch.arange(5, 53, 3)
    q = make_queries(len(positions), torch.float32, seed=6)
    singles = torch.cat([run(q[i:i + 1], keys, values, positions[i:i + 1], window=12)
                         for i in range(len(positions))])
    for count in (2, 7, 16):
        batch = run(q[:count], keys, values, positions[:count], window=12)
        assert same_bits(batch, singles[:count]), count


def test_any_grouping_or_order_of_rows_gives_the_same_bits(same_bits):
    """Prefill in one pass, in uneven pieces, or in shuffled order: every row keeps its bits."""
    keys, values = make_cache(48, torch.bfloat16, seed=7)
    positions = torch.arange(0, 40)
    q = make_queries(40, torch.bfloat16, seed=8)
    whole = run(q, keys, values, positions)
    pieces = torch.cat([run(q[a:b], keys, values, positions[a:b])
                        for a, b in [(0, 13), (13, 14), (14, 33), (33, 40)]])
    assert same_bits(pieces, whole)
    order = torch.randperm(40, generator=torch.Generator().manual_seed(9))
    assert same_bits(run(q[order], keys, values, positions[order]), whole[order])
    assert same_bits(run(q, keys, values, positions, rows_per_launch=4), whole)


def test_capacity_and_contents_beyond_the_position_do_not_matter(same_bits):
    keys, values = make_cache(100, torch.bfloat16, seed=10)
    positions = torch.tensor([20, 21, 35, 47])
    q = make_queries(4, torch.bfloat16, seed=11)
    expected = run(q, keys[:, :48], values[:, :48], positions)
    assert same_bits(run(q, keys, values, positions), expected)
    assert same_bits(run(q, keys[:, :53], values[:, :53], positions), expected)
    stale_keys, stale_values = keys.clone(), values.clone()
    stale_keys[:, 48:] = -1e4
    stale_values[:, 48:] = 3e4
    stale_keys[:, 22:40] = 7.0  # invisible to rows 0 and 1 only
    stale_values[:, 22:40] = -0.0
    got = run(q[:2], stale_keys, stale_values, positions[:2])
    assert same_bits(got, expected[:2])


def test_a_window_wider_than_the_position_changes_nothing(same_bits):
    keys, values = make_cache(64, torch.float32, seed=12)
    positions = torch.tensor([3, 15, 16, 50])
    q = make_queries(4, torch.float32, seed=13)
    assert same_bits(run(q, keys, values, positions, window=51),
                     run(q, keys, values, positions, window=0))


def test_zero_results_are_stored_as_positive_zero():
    keys, values = make_cache(64, torch.float32, seed=14)
    values = torch.full_like(values, -0.0)
    out = run(make_queries(3, torch.float32, seed=15), keys, values, torch.tensor([0, 9, 40]))
    assert (out.view(torch.int32) == 0).all()


def test_a_row_count_dependent_chunk_size_breaks_invariance(same_bits):
    """Negative control for the design: were the chunk size chosen per call, the chunk merge
    would happen at other cut points and rows would change bits."""
    keys, values = make_cache(64, torch.float32, seed=16)
    positions = torch.arange(40, 48)
    q = make_queries(8, torch.float32, seed=17)
    coarse = AttentionConfig(block_m=4, group=4, chunk=32, tile=8)
    singles = torch.cat([run(q[i:i + 1], keys, values, positions[i:i + 1]) for i in range(8)])
    assert not same_bits(run(q, keys, values, positions, config=coarse), singles)


def test_scaled_dot_product_attention_is_not_row_invariant_here(same_bits):
    """Negative control: torch's SDPA over the same cache changes rows with the query count."""
    keys, values = make_cache(64, torch.float32, seed=18)
    q = make_queries(16, torch.float32, seed=19)[:, :KV_HEADS]

    def sdpa(rows, start):
        end = start + rows.shape[0]
        mask = torch.arange(end)[None, :] <= (start + torch.arange(rows.shape[0]))[:, None]
        out = F.scaled_dot_product_attention(rows.transpose(0, 1), keys[:, :end],
                                             values[:, :end], attn_mask=mask)
        return out.transpose(0, 1)

    singles = torch.cat([sdpa(q[i:i + 1], 40 + i) for i in range(16)])
    assert any(not same_bits(sdpa(q[:count], 40), singles[:count]) for count in range(2, 17))


def test_bad_inputs_name_the_problem():
    keys, values = make_cache(64, torch.float32, seed=20)
    q = make_queries(2, torch.float32, seed=21)
    with pytest.raises(KernelError, match="position 64 is outside the cache of 64"):
        attention(q, keys, values, torch.tensor([3, 64]), SCALE)
    with pytest.raises(KernelError, match="2 positions given for 1 query rows"):
        attention(q[:1], keys, values, torch.tensor([3, 4]), SCALE)
    with pytest.raises(KernelError, match="share one dtype"):
        attention(q.to(torch.bfloat16), keys, values, torch.tensor([1, 2]), SCALE)
    with pytest.raises(KernelError, match="window"):
        attention(q, keys, values, torch.tensor([1, 2]), SCALE, window=-1)
    with pytest.raises(KernelError, match="multiple of Hkv"):
        attention(q[:, :5], keys, values, torch.tensor([1, 2]), SCALE)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_verify_rows_straddling_the_default_chunk_are_invariant(dtype, same_bits):
    keys, values = make_cache(CHUNK + 64, dtype, seed=22)
    positions = torch.arange(CHUNK - 8, CHUNK + 8)
    q = make_queries(16, dtype, seed=23)
    singles = torch.cat([attention(q[i:i + 1], keys, values, positions[i:i + 1], SCALE)
                         for i in range(16)])
    for count in (2, 5, 9, 16):
        batch = attention(q[:count], keys, values, positions[:count], SCALE)
        assert same_bits(batch, singles[:count]), count
