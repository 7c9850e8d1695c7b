"""benchmarks/matmul_ab.py: a smoke run of the build against itself (no timing is asserted) and
its bit comparison, with a build that computes something else as the negative control."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import matmul_ab  # noqa: E402

from tests.benchmarks.against_itself import run_against_itself  # noqa: E402


def test_against_itself_reports_same_bits():
    done, records = run_against_itself("matmul_ab.py", "_cpu_kernels", "--rows", "1,3,8",
                                       "--rounds", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["rows"] for r in records if "rows" in r] == [1, 3, 8]
    assert all(r["same_bits"] for r in records if "rows" in r)
    assert {r["build"] for r in records if "build" in r} == {"this", "other"}


def test_the_float_kernel_against_itself_reports_same_bits():
    done, records = run_against_itself("matmul_ab.py", "_cpu_kernels", "--float32", "--rows",
                                       "1,2", "--rounds", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--float32" in done.stdout
    assert [r["rows"] for r in records if "rows" in r] == [1, 2]
    assert all(r["same_bits"] for r in records if "rows" in r)


def test_float32_packs_the_dequantized_matrices_for_the_float_kernel():
    dot, float32 = matmul_ab.model_matrices(None), matmul_ab.model_matrices(None, float32=True)
    assert [name for name, _ in dot] == [name for name, _ in float32]
    assert {w.layout for _, w in dot} == {"dot"} and {w.format for _, w in float32} == {"f32"}
    assert all(a.shape == b.shape for (_, a), (_, b) in zip(dot, float32))


class OffByOneUlp:
    """A "build" whose products are the real ones moved by one ulp."""

    def __init__(self, real):
        self.real = real

    def matmul(self, x, rows, depth, weight, columns, format, layout, bias, out, flags):
        self.real.matmul(x, rows, depth, weight, columns, format, layout, bias, out, flags)
        view = np.ctypeslib.as_array((np.ctypeslib.ctypes.c_float * (rows * columns))
                                     .from_address(out))
        view[:] = np.nextafter(view, np.float32(np.inf))


def test_same_bits_sees_one_ulp():
    real = matmul_ab.extension(ROOT)
    matrices = matmul_ab.model_matrices(None)[:3]
    rng = np.random.default_rng(0)
    inputs = {w.shape[1]: rng.standard_normal((2, w.shape[1])).astype(np.float32)
              for _, w in matrices}
    assert matmul_ab.same_bits({"a": real, "b": real}, matrices, inputs)
    assert not matmul_ab.same_bits({"a": real, "b": OffByOneUlp(real)}, matrices, inputs)


def test_formats_keep_only_those_matrices():
    arguments = ("matmul_ab.py", "_cpu_kernels", "--rows", "1", "--rounds", "1", "--formats")
    done, _ = run_against_itself(*arguments, "q8_0")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "; 1 matrices" in done.stdout  # SmolLM2's q8_0 matrix is its tied output matrix
    missing, _ = run_against_itself(*arguments, "q5_k")
    assert missing.returncode != 0 and "no matrix of format q5_k" in missing.stderr


def test_random_matrices_against_itself_report_same_bits():
    done, records = run_against_itself("matmul_ab.py", "_cpu_kernels", "--shape", "256x48",
                                       "--formats", "q2_k,q1_0", "--rows", "1,3",
                                       "--rounds", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--shape 256x48" in done.stdout and "2 matrices" in done.stdout
    assert [r["rows"] for r in records if "rows" in r] == [1, 3]
    assert all(r["same_bits"] for r in records if "rows" in r)


def test_random_matrices_have_the_shape_and_formats_asked():
    packed = matmul_ab.random_matrices("512x40", ["q4_k", "tq1_0"])
    assert [(name, w.format, w.shape, w.layout) for name, w in packed] == \
        [("q4_k", "q4_k", (40, 512), "dot"), ("tq1_0", "tq1_0", (40, 512), "dot")]
