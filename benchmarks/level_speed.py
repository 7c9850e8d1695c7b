"""Decode step time per SIMD level, this checkout against another one, side by side.

    python benchmarks/level_speed.py --other /path/to/other/checkout   # e.g. a git worktree

Each round runs one short measurement per checkout and level in a fresh subprocess (with its
extension built in place), alternating checkouts, so machine load falls on both alike. A
measurement loads the bundled SmolLM2 (float32 and with its quantized blocks), prefills a
64-token prompt and times one-token steps; reported: the median step per checkout, level and
weights over the rounds, and the ratio this / other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURE = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]))
from exactdraft.kernels import cpu
from exactdraft.pretrained import build_target, load_checkpoint
cpu.set_simd_level(sys.argv[1])
target = build_target(load_checkpoint(None, keep_quantized=sys.argv[2] == "quantized",
                                      with_tokenizer=False), "torch")
state = target.new_state()
target.forward(state, list(range(100, 164)))
for _ in range(5):
    target.forward(state, [7])
times = []
for _ in range(int(sys.argv[4])):
    start = time.perf_counter()
    target.forward(state, [7])
    times.append(time.perf_counter() - start)
print(json.dumps({"step_ms": 1000 * sorted(times)[len(times) // 2]}))
"""


def measure(checkout: Path, level: str, weights: str, threads: int, steps: int) -> float:
    done = subprocess.run([sys.executable, "-c", MEASURE, level, weights, str(threads),
                           str(steps)], cwd=checkout, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["step_ms"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, help="the checkout to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--levels", default=None, help="comma list (default: all this CPU has; "
                        "amx_emulated, the tile code computed in C, may be named)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from exactdraft.kernels import cpu

    levels = args.levels.split(",") if args.levels else list(cpu.simd_levels())
    print(f"$ python benchmarks/level_speed.py --other {args.other} (best level here: "
          f"{cpu.simd_level()}, {args.threads} threads)")
    records = []
    for weights in ("float32", "quantized"):
        for level in levels:
            ours, theirs = [], []
            for _ in range(args.rounds):
                ours.append(measure(ROOT, level, weights, args.threads, args.steps))
                theirs.append(measure(args.other, level, weights, args.threads, args.steps))
            record = {"weights": weights, "level": level,
                      "this_step_ms": round(statistics.median(ours), 3),
                      "other_step_ms": round(statistics.median(theirs), 3)}
            record["this_over_other"] = round(record["this_step_ms"] / record["other_step_ms"], 3)
            records.append(record)
            print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
