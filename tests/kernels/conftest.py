"""Fixtures shared by the CPU kernel tests: every SIMD level this machine runs, and threads."""

from __future__ import annotations

from pathlib import Path

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


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo (None where it is absent),
    for tests whose premise is an instruction set extension."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return {word for line in text.splitlines() if line.startswith("flags")
            for word in line.split(":", 1)[1].split()}


def bits(array) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(array, dtype=np.float32)).view(np.uint32)


def assert_rows_match_alone(x: np.ndarray, packed, bias) -> None:
    """Every row of one matmul call has the bits that row gets in a call of its own."""
    together = bits(cpu.matmul(x, packed, bias))
    for r in range(x.shape[0]):
        alone = bits(cpu.matmul(x[r:r + 1], packed, bias))
        assert np.array_equal(together[r:r + 1], alone), (x.shape[0], r)
