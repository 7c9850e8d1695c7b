"""A smoke run of benchmarks/serve_bench.py on a tiny checkpoint (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import build_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_serve_bench_smoke(tmp_path):
    model = build_tiny_checkpoint(str(tmp_path / "model"), "llama",
                                  max_position_embeddings=4096)
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_bench.py"),
                           "--model", model, "--streams", "3", "--tokens", "6",
                           "--prefix-tokens", "64", "--repeats", "1", "--server-repeats", "1",
                           "--concurrency-rounds", "2",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "SIMD level:" in done.stdout and "command: python" in done.stdout
    report = json.loads((out / "serve_bench.json").read_text())
    assert report["machine"]["simd_level"] and report["machine"]["threads"] == 2
    assert "serve_bench.py" in report["command"]
    assert report["all_identical"] is True
    streams = report["concurrency"]
    assert streams["streams"] == 3 and streams["identical"] == [True] * 6  # 2 rounds of 3
    assert streams["rounds"] == 2 and len(streams["round_ratios"]) == 2
    for key in ("single_decode_tokens_per_second", "aggregate_decode_tokens_per_second",
                "ratio", "wall_ratio"):
        assert streams[key] > 0
    prefix = report["prefix_cache"]
    assert prefix["all_identical"] and prefix["runs"]
    assert prefix["shared_prefix_tokens"] >= 64 and prefix["hit_tokens"] >= 48
    assert prefix["cold_first_token_ms"] > 0 and prefix["hit_first_token_ms"] > 0
    served = report["server"]
    if importlib.util.find_spec("uvicorn") and importlib.util.find_spec("starlette"):
        assert served["texts_equal"] and served["tokens_equal"] and served["ratio"] > 0
        assert served["tokens"] >= 1
    else:
        assert "skipped" in served
    assert "skipped" in report["llama_cpp"]  # no --llama-python given
    assert "skipped" in report["servers"]
