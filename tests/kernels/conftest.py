"""Fixtures shared by the CPU kernel tests: every SIMD level this machine runs, and threads."""

from __future__ import annotations

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
