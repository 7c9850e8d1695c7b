"""A smoke run of benchmarks/agent_turn.py on a tiny checkpoint with the gemma template (no
timing is asserted): the follow-up reuses the first turn's prompt from the cache and writes the
text a server without a cache writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import build_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_agent_turn_smoke(tmp_path):
    model = build_tiny_checkpoint(str(tmp_path / "model"), "llama",
                                  max_position_embeddings=4096)
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "agent_turn.py"),
                           "--model", model, "--prompt-tokens", "3000", "--tokens", "6",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "SIMD level:" in done.stdout and "command: python" in done.stdout
    report = json.loads((out / "agent_turn.json").read_text())
    assert report["machine"]["threads"] == 2 and "agent_turn.py" in report["command"]
    turns = report["exactdraft"]
    first, second = turns["prompt_tokens"]
    assert abs(first - 3000) <= 30 and second > first  # the guide cut to the asked size
    assert first - 16 <= turns["follow_up_cached_tokens"] < second
    assert turns["identical"] is True and turns["follow_up_new_tokens"] >= 1
    assert turns["cold_first_token_s"] > 0 and turns["follow_up_first_token_s"] > 0
    assert "skipped" in report["llama_cpp"]  # no --llama-python given
