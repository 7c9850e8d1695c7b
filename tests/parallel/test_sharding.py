"""Column ranges cover the outputs once, in rank order, on group boundaries; a rank's rows of a
weight are the weight's rows, in its stored format, for every weight kind a model holds."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.errors import ParameterError
from exactdraft.formats import QuantizedTensor, StackedWeight
from exactdraft.parallel import ParallelSettings
from exactdraft.parallel.sharding import COLUMN_ALIGN, column_ranges, weight_rows


@pytest.mark.parametrize("columns,world_size", [
    (columns, world_size) for columns in (16, 64, 100, 576, 960, 49152, 49153)
    for world_size in (1, 2, 3, 4) if -(-columns // COLUMN_ALIGN) >= world_size])
def test_ranges_cover_every_column_once_in_rank_order(columns, world_size):
    ranges = column_ranges(columns, world_size)
    assert len(ranges) == world_size and ranges[0][0] == 0 and ranges[-1][1] == columns
    assert all(end == start for (_, end), (start, _) in zip(ranges, ranges[1:]))
    assert all(start % COLUMN_ALIGN == 0 and end > start for start, end in ranges)
    widths = [end - start for start, end in ranges]
    assert max(widths) - min(widths) <= 2 * COLUMN_ALIGN


def test_too_few_column_groups_are_refused_naming_the_count():
    with pytest.raises(ParameterError, match="48 output columns cannot be split across "
                                             "tensor_parallel=4"):
        column_ranges(48, 4)


def test_a_ranks_rows_are_the_weights_rows_in_each_kind():
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((40, 32)).astype(np.float32)
    assert np.array_equal(weight_rows(dense, 16, 32), dense[16:32])
    blocks = rng.integers(0, 256, (40, 34), dtype=np.uint8)  # q8_0: 34 bytes per 32 weights
    quantized = QuantizedTensor("q8_0", blocks, (40, 32))
    part = weight_rows(quantized, 16, 40)
    assert part.format == "q8_0" and part.shape == (24, 32)
    assert np.array_equal(part.data, blocks[16:40])
    stacked = StackedWeight([quantized, dense])  # rows 0..39 blocks, 40..79 float32
    across = weight_rows(stacked, 32, 48)
    assert isinstance(across, StackedWeight) and across.shape == (16, 32)
    assert np.array_equal(np.asarray(across), np.asarray(stacked)[32:48])
    assert np.array_equal(weight_rows(stacked, 48, 64), dense[8:24])


@pytest.mark.parametrize("field,value", [("timeout_s", 0), ("heartbeat_s", -1),
                                         ("threads_per_rank", 0)])
def test_bad_settings_are_refused_naming_them(field, value):
    with pytest.raises(ParameterError, match=field):
        ParallelSettings(2, **{field: value})
