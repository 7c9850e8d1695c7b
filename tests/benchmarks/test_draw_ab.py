"""benchmarks/draw_ab.py: a smoke run of the build against itself (no timing is asserted) and
its token comparison, with a build that draws another token as the negative control."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import draw_ab  # noqa: E402
from matmul_ab import extension  # noqa: E402

from tests.benchmarks.against_itself import run_against_itself  # noqa: E402


def test_against_itself_reports_same_tokens():
    done, records = run_against_itself("draw_ab.py", "_sampler", "--rounds", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "scans [" in done.stdout and "SIMD level" in done.stdout
    assert records[0] == {"same_tokens": True, "vocab": 49152}
    assert [r["setting"] for r in records[1:]] == [s[0] for s in draw_ab.SETTINGS]


class NextTokenWhenGreedy:
    """A "build" whose greedy draw is the real token plus one."""

    def __init__(self, real):
        self.real = real

    def draw(self, row, temperature, *rest):
        token = self.real.draw(row, temperature, *rest)
        return token + 1 if temperature == 0.0 else token


def test_same_tokens_sees_another_token():
    real = extension(ROOT, "_sampler")
    rows = [np.linspace(-3.0, 5.0, 300, dtype=np.float32)[::-1].copy()]
    assert draw_ab.same_tokens({"a": real, "b": real}, rows)
    assert not draw_ab.same_tokens({"a": real, "b": NextTokenWhenGreedy(real)}, rows)
