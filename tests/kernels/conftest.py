"""Fixtures shared by the CPU kernel tests: every SIMD level this machine runs, and threads."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.kernels import cpu

SIMD_LEVELS = cpu.simd_levels() if cpu.available() else ()


@pytest.fixture(params=SIMD_LEVELS)
def level(request):
    """Run the test once per SIMD level, restoring the default after."""
    default = cpu.simd_level()
    cpu.set_simd_level(request.param)
    yield request.param
    cpu.set_simd_level(default)


@pytest.fixture
def restore_threads():
    default = cpu.num_threads()
    yield
    cpu.set_num_threads(default)


def bits(array) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(array, dtype=np.float32)).view(np.uint32)


def assert_rows_match_alone(x: np.ndarray, packed, bias) -> None:
    """Every row of one matmul call has the bits that row gets in a call of its own."""
    together = bits(cpu.matmul(x, packed, bias))
    for r in range(x.shape[0]):
        alone = bits(cpu.matmul(x[r:r + 1], packed, bias))
        assert np.array_equal(together[r:r + 1], alone), (x.shape[0], r)
