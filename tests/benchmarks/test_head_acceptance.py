"""A smoke run of benchmarks/head_acceptance.py on the bundled SmolLM2 and its head."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import needs_smollm2

ROOT = Path(__file__).resolve().parents[2]


@needs_smollm2
@pytest.mark.parametrize("tree_width", [1, 2])
def test_head_acceptance_reports_counts_and_exactness(tree_width):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "head_acceptance.py"),
                           "--prompts", "1", "--tokens", "12", "--seeds", "1",
                           "--tree-width", str(tree_width),
                           "--temperatures", "0,0.7", "--threads", "1"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "SIMD level" in done.stdout and f"tree width {tree_width}" in done.stdout
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["temperature"] for r in records] == [0.0, 0.7]
    for record in records:
        assert record["head"] == "bundled" and record["identical_to_serial"] is True
        assert record["drafted"] > 0 and 0 <= record["accepted"] <= record["drafted"]
        assert record["tokens_per_pass"] >= 1.0
