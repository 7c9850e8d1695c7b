"""Runs an A/B benchmark script (benchmarks/*_ab.py) with this checkout's own build as the
other build, for the tests of those scripts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_against_itself(script: str, extension: str, *arguments: str
                       ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """(the finished run, its JSON records) of benchmarks/SCRIPT --other <this build's
    EXTENSION .so> ARGUMENTS."""
    built = sorted((ROOT / "exactdraft").glob(f"{extension}*.so"))[0]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--other",
                           str(built), *arguments], capture_output=True, text=True, timeout=600)
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return done, records
