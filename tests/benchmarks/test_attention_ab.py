"""benchmarks/attention_ab.py: a smoke run of the build against itself (no timing is asserted)
and its bit comparison, with a build that computes something else as the negative control."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import attention_ab  # noqa: E402
from matmul_ab import extension  # noqa: E402

from tests.benchmarks.against_itself import run_against_itself  # noqa: E402


def test_against_itself_reports_same_bits():
    done, records = run_against_itself("attention_ab.py", "_cpu_kernels", "--rounds", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert records[0] == {"same_bits": True}
    assert [(r["rows"], r["context"]) for r in records[1:]] == [(1, 256), (8, 256), (1, 1024),
                                                                 (8, 1024)]


class OffByOneUlp:
    """A "build" whose attention outputs are the real ones moved by one ulp."""

    def __init__(self, real):
        self.real = real

    def attention(self, q, rows, heads, dim, *rest):
        self.real.attention(q, rows, heads, dim, *rest)
        out = rest[-3]
        view = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_float * (rows * heads * dim))
                                     .from_address(out))
        view[:] = np.nextafter(view, np.float32(np.inf))


def test_same_bits_sees_one_ulp():
    real = extension(ROOT)
    assert attention_ab.same_bits({"a": real, "b": real})
    assert not attention_ab.same_bits({"a": real, "b": OffByOneUlp(real)})
