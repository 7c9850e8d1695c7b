"""The CPU attention kernel, this checkout's extension against another build of it, alternated
in one process.

    git worktree add /tmp/before HEAD~1 && (cd /tmp/before && python setup.py build_ext --inplace)
    python benchmarks/attention_ab.py --other /tmp/before [--rounds 7] [--threads 1] [--level avx2]

Both builds are loaded side by side (matmul_ab.load_builds). First the bits: on random queries,
keys and values for several head shapes (SmolLM2's 9 query heads over 3 KV heads of 64 among
them), row counts, positions, sliding windows and token trees, both builds' outputs must have
the same bytes. Then the speed at SmolLM2's shape (one layer's attention, 1 and 8 query rows,
256 and 1024 positions): per case the best of `--rounds` rounds of 100 calls for each build,
the builds alternating, and their ratio. Exits 1 when the builds' bits differ.
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
from matmul_ab import agree, load_builds, other_argument  # noqa: E402

HEAD_SHAPES = ((9, 3, 64), (4, 2, 128), (6, 2, 80), (8, 8, 64))  # (heads, KV heads, head dim)
# (rows, first position, window, tree)
CASES = ((1, 0, 0, False), (1, 250, 0, False), (8, 180, 0, False), (8, 200, 37, False),
         (5, 100, 0, True), (7, 260, 50, True))


def attend(module, q, keys, values, positions, window, out, paths=None) -> None:
    """out = attention of q [M, H, D] over keys, values [Hkv, capacity, D] by `module`."""
    rows, heads, dim = q.shape
    base = int(positions[0]) if paths is not None else 0
    module.attention(q.ctypes.data, rows, heads, dim, keys.ctypes.data, values.ctypes.data,
                     keys.shape[0], keys.shape[1], positions.ctypes.data, window, 0.125,
                     out.ctypes.data, 0 if paths is None else paths.ctypes.data, base)


def tree_rows(rng, rows: int, base: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, paths) of a random token tree of `rows` nodes rooted at `base`."""
    parents = [-1] + [int(rng.integers(0, r)) for r in range(1, rows)]
    paths = np.zeros((rows, rows), np.int32)
    positions = np.zeros(rows, np.int64)
    for r in range(rows):
        chain, node = [], r
        while node >= 0:
            chain.append(node)
            node = parents[node]
        chain.reverse()
        paths[r, :len(chain)] = chain
        positions[r] = base + len(chain) - 1
    return positions, paths


def problems(seed: int = 0):
    """The bit-comparison problems: (q, keys, values, positions, window, paths)."""
    rng = np.random.default_rng(seed)
    for heads, kv_heads, dim in HEAD_SHAPES:
        keys, values = (rng.standard_normal((kv_heads, 300, dim), dtype=np.float32)
                        for _ in range(2))
        for rows, first, window, tree in CASES:
            q = rng.standard_normal((rows, heads, dim), dtype=np.float32)
            positions, paths = tree_rows(rng, rows, first) if tree else \
                (np.arange(first, first + rows, dtype=np.int64), None)
            yield q, keys, values, positions, window, paths


def same_bits(builds: dict) -> bool:
    """Whether every problem gives the same output bytes in every build."""
    def output(module, problem) -> bytes:
        q, keys, values, positions, window, paths = problem
        out = np.empty_like(q)
        attend(module, q, keys, values, positions, window, out, paths)
        return out.tobytes()

    return all(agree(builds, output, problem) for problem in problems())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    other_argument(parser)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--level", default=None, help="SIMD level for both builds (default: best)")
    args = parser.parse_args()
    builds = load_builds(args.other, args.threads)
    if args.level:
        for module in builds.values():
            module.set_simd_level(args.level)
    info = machine()
    level = args.level or info["simd_level"]
    print(f"$ python benchmarks/attention_ab.py --other {args.other} --rounds {args.rounds} "
          f"--threads {args.threads}" + (f" --level {args.level}" if args.level else ""))
    print(f"{info['cpu']}, {info['cpus']} CPUs, SIMD level {level}")
    identical = same_bits(builds)
    print(json.dumps({"same_bits": identical}))
    rng = np.random.default_rng(1)
    keys, values = (rng.standard_normal((3, 1100, 64), dtype=np.float32) for _ in range(2))
    for rows, context in ((1, 256), (8, 256), (1, 1024), (8, 1024)):
        q = rng.standard_normal((rows, 9, 64), dtype=np.float32)
        positions = np.arange(context - rows, context, dtype=np.int64)
        out = np.empty_like(q)
        best = {name: float("inf") for name in builds}
        for _ in range(args.rounds):
            for name, module in builds.items():
                started = time.perf_counter()
                for _ in range(100):
                    attend(module, q, keys, values, positions, 0, out)
                best[name] = min(best[name], (time.perf_counter() - started) / 100)
        print(json.dumps({"rows": rows, "context": context,
                          "this_us": round(best["this"] * 1e6, 1),
                          "other_us": round(best["other"] * 1e6, 1),
                          "this_over_other": round(best["this"] / best["other"], 3)}))
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
