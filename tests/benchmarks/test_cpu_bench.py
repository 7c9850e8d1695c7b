"""A smoke run of benchmarks/cpu_bench.py on a tiny checkpoint (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import build_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_bench_smoke(tmp_path):
    model = build_tiny_checkpoint(str(tmp_path / "model"), "llama",
                                  max_position_embeddings=4096)
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cpu_bench.py"), "--model",
                           model, "--tools", "exactdraft", "--tokens", "8", "--repeats", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "cpu_bench_model.json").read_text())
    assert report["machine"]["simd_level"] and report["machine"]["cpu"]
    record = report["records"][0]
    assert record["tool"] == "exactdraft"
    assert len(record["runs"]) == 8  # 4 workloads x serial and drafted
    for run in record["runs"]:
        assert run["tokens"] == 8
        assert run["identical_to_serial"] in (None, True)
    assert sorted(map(int, record["verify_cost"])) == list(range(1, 17))
    assert "| exactdraft |" in (out / "cpu_bench_model.md").read_text()
