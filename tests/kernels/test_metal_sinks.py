"""The attention shader with sinks (on the emulator here, on Metal where MLX has it): within
float32 rounding of the float64 softmax over [scores, sink] (control: the sink dropped misses
it), and a row computed alone over a buffer that ends at its own chunk with NaN past its
position has the bits it has in any pass (the negative control for that comparison is
test_metal.test_plain_numpy_attention_breaks_row_invariance); sinks of another count or not
finite are refused."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.kernels.metal import MetalShaderError

mx = pytest.importorskip("mlx.core")

from tests.kernels import test_metal  # noqa: E402
from tests.kernels.test_cpu_attention_sinks import sink_reference  # noqa: E402
from tests.kernels.test_metal import (  # noqa: E402
    HEADS,
    POSITIONS,
    attention_case,
    host,
    row_mismatches,
)

# test_metal's fixtures: the emulator, and Metal where MLX has it.
emulator_cache, shaders = test_metal.emulator_cache, test_metal.shaders

SINKS = np.array([-3.0, 1.5, 4.0, 9.0], np.float32)


@pytest.mark.parametrize("dtype,window", [("float32", 0), ("bfloat16", 50)])
def test_sinks_match_the_float64_softmax(shaders, dtype, window):
    rng = np.random.default_rng(21)
    q, keys, values = attention_case(rng, dtype)
    as_float = [np.asarray(c.astype(mx.float32)) for c in (keys, values)]
    reference = sink_reference(q, *as_float, POSITIONS, window, 0.125, SINKS)
    out = host(shaders.attention(q, keys, values, POSITIONS, window, 0.125, SINKS))
    assert np.abs(out - reference).max() < 2e-6 * max(1.0, np.abs(reference).max())
    dropped = host(shaders.attention(q, keys, values, POSITIONS, window, 0.125))
    assert np.abs(dropped - reference).max() > 1e-2


@pytest.mark.parametrize("window", [0, 64])
def test_rows_with_sinks_have_their_bits_alone(shaders, window):
    """Every row count 1..16 in random orders, and each row over a buffer cut after its own
    chunk with NaN past its position."""
    q, keys, values = attention_case(np.random.default_rng(22), "float32")

    def attend(rows, keys=keys, values=values):
        return shaders.attention(q[rows], keys, values, POSITIONS[rows], window, 0.125, SINKS)

    assert row_mismatches(attend, np.arange(len(POSITIONS))) == []
    whole = host(attend(np.arange(len(POSITIONS))))
    for i, p in enumerate(POSITIONS):
        past = mx.array(np.arange((p // 64 + 1) * 64)[None, :, None] > p)
        short = [mx.where(past, mx.array(np.nan, c.dtype), c[:, :past.shape[1]])
                 for c in (keys, values)]
        assert host(attend(np.array([i]), *short)).tobytes() == whole[i:i + 1].tobytes(), i


@pytest.mark.parametrize("sinks", [SINKS[:3], np.array([0, np.inf, 0, 0], np.float32)])
def test_bad_sinks_are_refused(shaders, sinks):
    q, keys, values = attention_case(np.random.default_rng(23), "float32")
    with pytest.raises(MetalShaderError, match=f"sinks must be {HEADS} finite logits"):
        shaders.attention(q[:1], keys, values, POSITIONS[:1], 0, 0.125, sinks)
