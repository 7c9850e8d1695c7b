"""A smoke run of benchmarks/json_extract.py on the bundled SmolLM2, and its turn-taking."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import needs_smollm2

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import json_extract  # noqa: E402


class _Recorder:
    """A generator whose runs write their name in one shared log and report a set speed."""

    def __init__(self, name: str, speed: float, log: list[str]) -> None:
        self.name, self.speed, self.log = name, speed, log

    def generate(self, prompt, tokens, temperature, **options):
        self.log.append(self.name)
        return SimpleNamespace(stats=SimpleNamespace(tokens_per_second=self.speed))


def test_runs_take_turns_within_each_repeat_and_the_order_rotates():
    log: list[str] = []
    runs = {name: (_Recorder(name, speed, log), {}) for name, speed in
            (("a", 1.0), ("b", 2.0), ("c", 3.0))}
    measured = json_extract.timed_side_by_side(runs, tokens=4, repeats=4)
    assert log == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert {name: speeds for name, (speeds, _) in measured.items()} == \
        {"a": [1.0] * 4, "b": [2.0] * 4, "c": [3.0] * 4}


@needs_smollm2
def test_json_extract_reports_identical_drafted_runs_and_valid_seeds():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "json_extract.py"),
                           "--tokens", "48", "--repeats", "1", "--seeds", "2"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert "SIMD level" in out
    drafted = re.findall(r"^(forced drafts|forced \+ lookup) .*identical: (\w+)$", out, re.M)
    assert drafted == [("forced drafts", "True"), ("forced + lookup", "True")]
    assert re.search(r"constraint cost inside a serial run: [0-9.]+ ms per token", out)
    assert re.search(r"temperature 0.8: [0-2] of 2 seeds parse and validate", out)
