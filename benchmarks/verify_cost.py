"""What a verify pass costs against a one-row step, per SIMD level: W = 1..8 rows.

Drafting pays when a pass of W rows costs little more than one step, so this reports, for the
bundled SmolLM2 (or --model) with float32 and with quantized weights, the median time of a
W-row pass over the same context divided by the median one-row step, at every SIMD level this
machine runs. All levels give the same bits (tests/kernels/test_cpu_levels.py), so only the
speed differs. Run on a quiet machine:

    python benchmarks/verify_cost.py [--model FILE] [--context 256] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WIDTHS = (1, 2, 4, 8)


def pass_costs(target, context: int, repeats: int, widths: tuple[int, ...] = WIDTHS,
               statistic=statistics.median) -> dict[int, float]:
    """Median (or `statistic`) seconds of a W-row pass at `context` positions, per width."""
    from exactdraft.guard import probe_tokens

    prefix = probe_tokens(context, target.vocab_size, salt=11)
    window = probe_tokens(max(widths), target.vocab_size, salt=12)
    state = target.new_state()
    target.forward(state, prefix)
    times: dict[int, list[float]] = {width: [] for width in widths}
    for _ in range(repeats):
        for width in widths:  # interleaved, so drifting machine load hits every width alike
            started = time.perf_counter()
            target.forward(state, window[:width], rows="all")
            times[width].append(time.perf_counter() - started)
            target.truncate(state, len(prefix))
    return {width: statistic(values) for width, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file or folder (default: bundled)")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--levels", default=None, help="comma list (default: all this CPU has; "
                        "amx_emulated, the tile code computed in C, may be named)")
    parser.add_argument("--json", default=None, help="also write the records here")
    args = parser.parse_args()

    from exactdraft import pretrained
    from exactdraft.kernels import cpu

    levels = args.levels.split(",") if args.levels else list(cpu.simd_levels())
    levels = [level for level in levels if level != "scalar"] or levels
    records = []
    for quantized in (False, True):
        checkpoint = pretrained.load_checkpoint(args.model, keep_quantized=quantized)
        target = pretrained.build_target(checkpoint, "torch")
        for level in levels:
            cpu.set_simd_level(level)
            target.forward(target.new_state(), [1, 2, 3])  # warm the level's code
            costs = pass_costs(target, args.context, args.repeats)
            record = {"weights": "quantized" if quantized else "float32", "simd": level,
                      "threads": os.cpu_count(), "context": args.context,
                      "step_ms": round(costs[1] * 1e3, 2),
                      **{f"w{width}_over_step": round(costs[width] / costs[1], 3)
                         for width in WIDTHS[1:]}}
            records.append(record)
            print(json.dumps(record), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
