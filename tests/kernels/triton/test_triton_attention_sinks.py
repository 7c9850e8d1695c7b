"""The Triton attention with sinks under the interpreter: the float64 softmax over [scores, sink]
within float32 rounding (control: the sink dropped misses it), and rows with the bits of one-row
calls across chunk boundaries, with and without a window (control: rows merged with the
row-count dependent chunk size of test_triton_attention differ)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the Triton kernel tests need the triton package")

import torch  # noqa: E402

from exactdraft.kernels.triton.attention import AttentionConfig, attention  # noqa: E402
from exactdraft.kernels.triton.launch import KernelError  # noqa: E402
from tests.kernels.test_cpu_attention_sinks import (  # noqa: E402
    sink_reference as float64_softmax,
)
from tests.kernels.triton.test_triton_attention import (  # noqa: E402
    SCALE,
    SMALL,
    make_cache,
    make_queries,
)

SINKS = torch.tensor([-3.0, 0.0, 1.5, 4.0, -0.5, 9.0])


def sink_reference(q, keys, values, positions, window):
    return torch.from_numpy(float64_softmax(q.numpy(), keys.numpy(), values.numpy(),
                                            positions.numpy(), window, SCALE, SINKS.numpy()))


def run(q, keys, values, positions, window=0, config=SMALL, sinks=SINKS):
    return attention(q, keys, values, positions, SCALE, window, config=config, sinks=sinks)


@pytest.mark.parametrize("window", [0, 12])
def test_sinks_match_the_float64_softmax(window):
    keys, values = make_cache(64, torch.float32, seed=31)
    positions = torch.tensor([0, 7, 15, 16, 40, 63])
    q = make_queries(len(positions), torch.float32, seed=32)
    exact = sink_reference(q, keys, values, positions, window)
    out = run(q, keys, values, positions, window)
    assert ((out.double() - exact).abs() <= 1e-6 * (1 + exact.abs())).all()
    dropped = run(q, keys, values, positions, window, sinks=None)
    assert (dropped.double() - exact).abs().max() > 1e-2


@pytest.mark.parametrize("window", [0, 12])
def test_rows_with_sinks_have_their_one_row_bits(window, same_bits):
    keys, values = make_cache(48, torch.float32, seed=33)
    positions = torch.arange(10, 34)  # crosses chunk boundaries at 16 and 32
    q = make_queries(len(positions), torch.float32, seed=34)
    singles = torch.cat([run(q[i:i + 1], keys, values, positions[i:i + 1], window)
                         for i in range(len(positions))])
    for start, count in [(0, 2), (0, 7), (3, 5), (5, 16), (0, 24)]:
        batch = run(q[start:start + count], keys, values, positions[start:start + count], window)
        assert same_bits(batch, singles[start:start + count]), (start, count)
    coarse = AttentionConfig(block_m=4, group=4, chunk=32, tile=8)
    assert not same_bits(run(q, keys, values, positions, window, config=coarse), singles)


def test_sinks_of_another_shape_are_refused():
    keys, values = make_cache(16, torch.float32, seed=35)
    q = make_queries(1, torch.float32, seed=36)
    with pytest.raises(KernelError, match=r"sinks must have shape \(6,\)"):
        run(q, keys, values, torch.tensor([3]), sinks=SINKS[:5])

