"""The keyed draw (exactdraft._sampler), this checkout's extension against another build of it,
alternated in one process.

    git worktree add /tmp/before HEAD~1 && (cd /tmp/before && python setup.py build_ext --inplace)
    python benchmarks/draw_ab.py --other /tmp/before [--rounds 7]

Both builds are loaded side by side (the same module name from two files). The rows are logits
of the bundled SmolLM2 (or --model) after prompts of a few lengths, as float32 (what a pass
returns) and float64. First the tokens: every setting below at 64 positions of every row must
give the same token in both builds. Then the speed: per setting the best of `--rounds` rounds
of 200 draws for each build, the builds alternating, and their ratio. Prints the scans this CPU
runs (1 scalar, 2 AVX2, 3 AVX-512). Exits 1 when the builds' tokens differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from cpu_bench import machine  # noqa: E402
from matmul_ab import agree, extension, other_argument  # noqa: E402

# (name, temperature, top_k, top_p, min_p)
SETTINGS = (("greedy", 0.0, 0, 1.0, 0.0), ("t0.7", 0.7, 0, 1.0, 0.0),
            ("t0.7 top_k 40", 0.7, 40, 1.0, 0.0), ("t0.7 top_p 0.9", 0.7, 0, 0.9, 0.0),
            ("t1.0 min_p 0.05", 1.0, 0, 1.0, 0.05))


def logits_rows(model: str | None) -> list[np.ndarray]:
    """float32 logits rows of the model after prompts of 1, 16 and 100 tokens."""
    import exactdraft as xd

    target = xd.Generator.from_pretrained(model, progress=False).target
    rows = []
    for length in (1, 16, 100):
        state = target.new_state()
        rows.append(np.asarray(target.forward(state, list(range(200, 200 + length)))[-1],
                               dtype=np.float32))
    return rows


def draw(module, row: np.ndarray, setting: tuple, pos: int) -> int:
    _, temperature, top_k, top_p, min_p = setting
    return module.draw(row, temperature, top_k, top_p, min_p, 1234, pos)


def same_tokens(builds: dict, rows: list[np.ndarray]) -> bool:
    """Whether every build draws the same token for every row, setting and position."""
    def tokens(module, row, setting) -> tuple:
        return tuple(draw(module, row, setting, pos) for pos in range(64))

    return all(agree(builds, tokens, row, setting)
               for row in rows + [row.astype(np.float64) for row in rows]
               for setting in SETTINGS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    other_argument(parser)
    parser.add_argument("--model", default=None, help="checkpoint (default: bundled SmolLM2)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    builds = {"this": extension(ROOT, "_sampler"), "other": extension(args.other, "_sampler")}
    info = machine()
    print(f"$ python benchmarks/draw_ab.py --other {args.other} --rounds {args.rounds}")
    print(f"{info['cpu']}, {info['cpus']} CPUs, SIMD level {info['simd_level']}, "
          f"scans {list(builds['this'].scans())}")
    rows = logits_rows(args.model)
    identical = same_tokens(builds, rows)
    print(json.dumps({"same_tokens": identical, "vocab": int(rows[0].size)}))
    for setting in SETTINGS:
        best = {name: float("inf") for name in builds}
        for _ in range(args.rounds):
            for name, module in builds.items():
                started = time.perf_counter()
                for i in range(200):
                    draw(module, rows[i % len(rows)], setting, i)
                best[name] = min(best[name], (time.perf_counter() - started) / 200)
        print(json.dumps({"setting": setting[0], "this_us": round(best["this"] * 1e6, 1),
                          "other_us": round(best["other"] * 1e6, 1),
                          "this_over_other": round(best["this"] / best["other"], 3)}))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
