"""Two commits side by side: the decode, verify-pass and serving benchmarks in both, alternating.

    python benchmarks/commit_ab.py --base 5931e44                   # all three, 3 rounds
    python benchmarks/commit_ab.py --base HEAD~1 --benchmarks verify --rounds 2

The base commit is checked out into a temporary git worktree (its C extensions copied from this
tree when csrc/ and setup.py are the same in both, built there otherwise); this tree is the
other side. Each round runs every benchmark once in each tree, the order flipping every round so
that a machine's drift falls on both alike:

- cpu: `benchmarks/cpu_bench.py --tools exactdraft-q --tokens N --repeats R` (decode tokens/s
  and tokens per pass of each workload, serial and drafted);
- verify: `benchmarks/verify_cost.py --levels <this CPU's best>` (one-row step ms, and W-row
  passes over one row);
- serve: `benchmarks/serve_bench.py --streams 4 --tokens 32 --prefix-tokens 500 --repeats 2
  --server-repeats 3` (concurrent over solo, prefix-cache time to first token, server over API).

Prints every figure's median over the rounds in each tree and this tree over the base, with the
SIMD level. Nothing is written outside a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def prepare_base(commit: str, where: Path) -> Path:
    """A worktree of `commit` under `where`, with C extensions that match its csrc/."""
    tree = where / "base"
    git("worktree", "add", "--detach", str(tree), commit)
    same_sources = subprocess.run(["git", "diff", "--quiet", commit, "HEAD", "--", "csrc",
                                   "setup.py"], cwd=ROOT).returncode == 0
    built = list((ROOT / "exactdraft").glob("*.so")) + list((ROOT / "exactdraft").glob("*.pyd"))
    if same_sources and built:
        for library in built:
            shutil.copy2(library, tree / "exactdraft" / library.name)
    else:
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tree,
                       check=True, capture_output=True)
    return tree


def run(tree: Path, argv: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed in {tree}:\n{done.stdout}\n{done.stderr}")


def cpu_figures(tree: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    out.mkdir(parents=True, exist_ok=True)
    run(tree, ["benchmarks/cpu_bench.py", "--tools", "exactdraft-q", "--tokens",
               str(args.tokens), "--repeats", str(args.repeats), "--out", str(out)])
    report = json.loads(next(out.glob("*.json")).read_text())
    figures = {}
    for record in report["records"]:
        for entry in record.get("runs", []):
            name = f"{entry['workload']} {'drafted' if entry['drafted'] else 'serial'}"
            figures[f"decode tok/s, {name}"] = entry["decode_tokens_per_second"]
            if entry["drafted"]:
                figures[f"tokens/pass, {name}"] = entry["tokens_per_pass"]
    return figures


def verify_figures(tree: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    path = out / "verify.json"
    run(tree, ["benchmarks/verify_cost.py", "--levels", args.level, "--json", str(path)])
    figures = {}
    for record in json.loads(path.read_text()):
        for key, value in record.items():
            if key == "step_ms" or key.endswith("_over_step"):
                figures[f"{record['weights']} {key}"] = value
    return figures


def serve_figures(tree: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    run(tree, ["benchmarks/serve_bench.py", "--streams", "4", "--tokens", "32",
               "--prefix-tokens", "500", "--repeats", "2", "--server-repeats", "3",
               "--out", str(out)])
    report = json.loads((out / "serve_bench.json").read_text())
    figures = {}
    for part in ("concurrency", "prefix_cache", "server"):
        for key, value in report.get(part, {}).items():
            timed = key.endswith(("per_second", "ratio", "_ms"))
            if timed and isinstance(value, (int, float)) and not isinstance(value, bool):
                figures[f"{part} {key}"] = value
    return figures


BENCHMARKS = {"cpu": cpu_figures, "verify": verify_figures, "serve": serve_figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare this tree with")
    parser.add_argument("--benchmarks", default="cpu,verify,serve")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from exactdraft.kernels import cpu

    args.level = cpu.simd_level()
    names = args.benchmarks.split(",")
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; known: {', '.join(BENCHMARKS)}")
    head = git("rev-parse", "--short", "HEAD")
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--", "exactdraft",
                                           "benchmarks") else ""
    print(f"SIMD level: {args.level}; base {args.base} against {head}{dirty}; "
          f"{args.rounds} rounds, order flipping each round")
    work = Path(tempfile.mkdtemp(prefix="commit_ab_"))
    try:
        trees = {"base": prepare_base(args.base, work), "this": ROOT}
        seen: dict[str, dict[str, list[float]]] = {"base": {}, "this": {}}
        for round_index in range(args.rounds):
            order = ("base", "this") if round_index % 2 == 0 else ("this", "base")
            for name in names:
                for side in order:
                    out = work / f"{side}-{name}-{round_index}"
                    out.mkdir()
                    for key, value in BENCHMARKS[name](trees[side], out, args).items():
                        seen[side].setdefault(key, []).append(value)
            print(f"round {round_index + 1} done", file=sys.stderr, flush=True)
        print(f"{'figure':<44} {'base':>10} {'this':>10} {'this/base':>10}")
        for key, values in seen["base"].items():
            if key not in seen["this"]:
                continue
            base, this = statistics.median(values), statistics.median(seen["this"][key])
            ratio = f"{this / base:10.3f}" if base else f"{'-':>10}"
            print(f"{key:<44} {base:10.2f} {this:10.2f} {ratio}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(work / "base")], cwd=ROOT,
                       capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
