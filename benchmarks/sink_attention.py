"""gpt-oss's attention with sinks (models/attention_sinks.py) on the C-kernel backend, this
checkout against another one, each measured in a fresh subprocess with its own package.

    python benchmarks/sink_attention.py [--other /path/to/other/checkout] [--rounds 3]

A tiny gpt-oss attention shape (64 query heads of 64, 8 KV heads, full attention): a 512-row
prefill chunk over 512 keys and one row over 2048 keys, through the mixer's view of the
backend (attention_sinks._WithSinks, which both the host-side sink scale and the in-kernel
sinks provide), and the backend's attention without sinks beside it. Reported per checkout and
case: the best call over the rounds (each round at least 3 calls and about a second of them;
the checkouts alternating, so machine load falls on both alike), and with --other the ratio
other / this.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {"prefill 512 rows over 512 keys": (512, 511), "1 row over 2048 keys": (1, 2047)}

MEASURE = r"""
import json, sys, time
import numpy as np
import exactdraft
from exactdraft.backends.torch_cpu import TorchCPUBackend
from exactdraft.models.attention_sinks import _WithSinks
rows, last = int(sys.argv[1]), int(sys.argv[2])
heads, kv_heads, dim, capacity = 64, 8, 64, 2304
rng = np.random.default_rng(0)
be = TorchCPUBackend()
keys, values = (be.vector(rng.standard_normal((kv_heads, capacity, dim)).astype(np.float32))
                for _ in range(2))
q = be.vector(rng.standard_normal((rows, heads, dim)).astype(np.float32))
view = _WithSinks(be, rng.normal(size=heads).astype(np.float32))
positions = np.arange(last - rows + 1, last + 1)


def best(backend):
    backend.attention(q, keys, values, positions, 0, dim ** -0.5)
    times = []
    while len(times) < 3 or sum(times) < 1.0:  # the best of calls for about a second
        start = time.perf_counter()
        backend.attention(q, keys, values, positions, 0, dim ** -0.5)
        times.append(time.perf_counter() - start)
    return min(times)


print(json.dumps({"seconds": best(view), "plain_seconds": best(be),
                  "package": exactdraft.__file__}))
"""


def measure(checkout: Path, rows: int, last: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(rows), str(last)], env=env,
                          capture_output=True, text=True, check=True, cwd=checkout)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", type=Path, help="another checkout, its extension built")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    checkouts = {"this": ROOT} | ({"other": args.other.resolve()} if args.other else {})
    for case, (rows, last) in CASES.items():
        best: dict[str, dict] = {}
        for _ in range(args.rounds):
            for name, checkout in checkouts.items():
                result = measure(checkout, rows, last)
                if name not in best or result["seconds"] < best[name]["seconds"]:
                    best[name] = result
        record = {"case": case, **{f"{name}_ms": round(r["seconds"] * 1e3, 3)
                                   for name, r in best.items()},
                  **{f"{name}_without_sinks_ms": round(r["plain_seconds"] * 1e3, 3)
                     for name, r in best.items()}}
        if "other" in best:
            record["other_over_this"] = round(best["other"]["seconds"] /
                                              best["this"]["seconds"], 1)
        record["packages"] = {name: r["package"] for name, r in best.items()}
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
