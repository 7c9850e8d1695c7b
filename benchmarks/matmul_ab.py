"""The integer-dot matmuls of a whole model (or with --float32 its float kernel's), this
checkout's extension against another build of it, alternated in one process.

    git worktree add /tmp/before HEAD~1 && (cd /tmp/before && python setup.py build_ext --inplace)
    python benchmarks/matmul_ab.py --other /tmp/before [--rows 1,8] [--rounds 15]

Both builds are loaded side by side (the same module name from two files), every quantized
matrix of the bundled SmolLM2 (or --model; or with --shape KxN one random matrix of each of
--formats, the blocks cpu_kernels.py times) is packed once in the dot layout, and each round
runs all of them in model order at each row count M, once per build, the builds alternating,
so that a noisy machine's load falls on both alike. Reported per M: the median milliseconds of
a round for each build and their ratio, and whether the two builds' outputs of every matrix
have the same bytes; with M = 1 and M = 8, also what a W = 8 pass of those matmuls costs over
a one-row step for each build. Exits 1 when the builds' bits differ.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_bench import machine  # noqa: E402


def extension(location: Path, name: str = "_cpu_kernels"):
    """The C extension module `name` built in a checkout (or the file itself), loaded on its
    own."""
    files = [location] if location.is_file() else \
        sorted((location / "exactdraft").glob(f"{name}*.so"))
    if not files:
        raise SystemExit(f"no built {name} extension in {location}/exactdraft")
    spec = importlib.util.spec_from_file_location(f"exactdraft.{name}", files[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def other_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--other", type=Path, required=True,
                        help="a checkout with its extension built in place, or the .so file")


def load_builds(other: Path, threads: int) -> dict:
    """{"this": this checkout's extension, "other": the other build's}, on `threads` threads."""
    builds = {"this": extension(ROOT), "other": extension(other)}
    for module in builds.values():
        module.set_num_threads(threads)
    return builds


def model_matrices(model: str | None, float32: bool = False,
                   formats: list[str] | None = None, native=None) -> list:
    """Every quantized matrix of the checkpoint (the tied embedding as the output matrix), in
    model order, packed in the dot layout (by the build `native`, whose records may differ
    from this checkout's; default this one); with `float32`, those matrices dequantized and
    packed for the float kernel (the path of keep_quantized=False); with `formats`, only the
    matrices stored in those formats."""
    from exactdraft import pretrained
    from exactdraft.kernels.cpu_weights import (
        FORMAT_ROWS,
        PackedMatrix,
        _as_bytes,
        _dot_records,
        pack_matrix,
    )

    def dot_layout(tensor):
        if native is None:
            return pack_matrix(tensor, layout="dot")
        records = _dot_records(_as_bytes(tensor.data), tensor.format, tensor.shape[1], native)
        return PackedMatrix(tensor.format, tensor.shape, records, "dot")

    checkpoint = pretrained.load_checkpoint(model, keep_quantized=True, with_tokenizer=False)
    packed = []
    for name, tensor in checkpoint.tensors.items():
        quantized = getattr(tensor, "format", None)
        if quantized in FORMAT_ROWS and FORMAT_ROWS[quantized].integer_dot and \
                (formats is None or quantized in formats):
            packed.append((name, pack_matrix(tensor.dequantize()) if float32 else
                           dot_layout(tensor)))
    return packed


def random_matrices(shape: str, formats: list[str], native: object | None = None) -> list:
    """One random [N, K] matrix per format (`shape` "KxN", as cpu_kernels.py writes it; the
    blocks cpu_kernels.py times), packed in the dot layout by the build `native` (default this
    checkout's)."""
    from cpu_kernels import format_blocks

    from exactdraft.formats import QuantizedTensor
    from exactdraft.kernels.cpu_weights import PackedMatrix, _as_bytes, _dot_records

    depth, columns = (int(value) for value in shape.split("x"))
    rng = np.random.default_rng(0)
    packed = []
    for name in formats:
        dense = rng.standard_normal((columns, depth), dtype=np.float32)
        tensor = QuantizedTensor(name, format_blocks(name, dense), (columns, depth))
        records = _dot_records(_as_bytes(tensor.data), name, depth, native)
        packed.append((name, PackedMatrix(name, (columns, depth), records, "dot")))
    return packed


def multiply(module, w, x: np.ndarray, out: np.ndarray) -> None:
    """out [M, N] = x [M, K] times the packed w [N, K] transposed, by `module`."""
    from exactdraft.kernels.cpu_weights import FORMAT_CODES

    columns, depth = w.shape
    module.matmul(x.ctypes.data, x.shape[0], depth, w.address, columns, FORMAT_CODES[w.format],
                  w.layout_code, 0, out.ctypes.data, 0)


def one_round(module, matrices, inputs, outputs) -> float:
    started = time.perf_counter()
    for _, w in matrices:
        multiply(module, w, inputs[w.shape[1]], outputs[w.shape[0]])
    return time.perf_counter() - started


def same_bits(builds: dict, matrices, inputs) -> bool:
    """Whether every matrix gives the same output bytes in every build (`matrices`: one list
    for all builds, or each build's own packing of the same matrices by name)."""
    def product(module, w) -> bytes:
        x = inputs[w.shape[1]]
        out = np.empty((x.shape[0], w.shape[0]), np.float32)
        multiply(module, w, x, out)
        return out.tobytes()

    if not isinstance(matrices, dict):
        return all(agree(builds, product, w) for _, w in matrices)
    count = len(next(iter(matrices.values())))
    return all(len({product(module, matrices[name][i][1]) for name, module in builds.items()})
               == 1 for i in range(count))


def agree(builds: dict, output, *args) -> bool:
    """Whether output(module, *args), bytes, is the same for every build."""
    return len({output(module, *args) for module in builds.values()}) == 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    other_argument(parser)
    parser.add_argument("--model", default=None, help="GGUF file (default: bundled SmolLM2)")
    parser.add_argument("--rows", default="1,8", help="comma list of row counts M")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--formats", default=None,
                        help="comma list of weight formats to keep (default: all)")
    parser.add_argument("--float32", action="store_true",
                        help="the same matrices dequantized, through the float kernel")
    parser.add_argument("--shape", default=None,
                        help="KxN: instead of a model's, one random matrix of each of "
                             "--formats (needed with it)")
    args = parser.parse_args()
    if args.shape and (not args.formats or args.float32 or args.model):
        parser.error("--shape takes --formats, and neither --model nor --float32")
    if args.shape and not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", args.shape):
        parser.error(f"--shape must be KxN (two positive integers), got {args.shape!r}")
    builds = load_builds(args.other, args.threads)
    formats = args.formats.split(",") if args.formats else None
    # Each build packs its own records: their layout may differ between the builds.
    matrices = {name: random_matrices(args.shape, formats, module) if args.shape else
                model_matrices(args.model, args.float32, formats, module)
                for name, module in builds.items()}
    if not matrices["this"]:
        raise SystemExit(f"no matrix of format {args.formats} in the model")
    info = machine()
    print(f"$ python benchmarks/matmul_ab.py --other {args.other} --rows {args.rows} "
          + (f"--model {args.model} " if args.model else "")
          + f"--rounds {args.rounds} --threads {args.threads}"
          + (f" --formats {args.formats}" if args.formats else "")
          + (" --float32" if args.float32 else "")
          + (f" --shape {args.shape}" if args.shape else ""))
    print(f"{info['cpu']}, {info['cpus']} CPUs, SIMD level {info['simd_level']}; "
          f"{len(matrices['this'])} matrices")
    rng = np.random.default_rng(0)
    widths = [int(value) for value in args.rows.split(",")]
    depths = {w.shape[1] for _, w in matrices["this"]}
    columns = {w.shape[0] for _, w in matrices["this"]}
    times: dict[tuple[str, int], list[float]] = {(b, m): [] for b in builds for m in widths}
    buffers = {m: ({d: rng.standard_normal((m, d)).astype(np.float32) for d in depths},
                   {c: np.empty((m, c), np.float32) for c in columns}) for m in widths}
    identical = {m: same_bits(builds, matrices, buffers[m][0]) for m in widths}
    for name, module in builds.items():  # warm both builds' code and the weights' pages
        for m in widths:
            one_round(module, matrices[name], *buffers[m])
    for _ in range(args.rounds):
        for m in widths:
            for name, module in builds.items():
                # Each build has its own thread pool, whose idle workers spin for 0.1 ms
                # after a call: an untimed round first lets the other build's stop (and
                # wakes this one's) without a sleep, after which the workers would sleep. It
                # also brings this build's weights as close to the cores as they fit, the
                # same for both builds.
                one_round(module, matrices[name], *buffers[m])
                times[(name, m)].append(one_round(module, matrices[name], *buffers[m]))
    medians = {key: statistics.median(values) * 1e3 for key, values in times.items()}
    for m in widths:
        print(json.dumps({"rows": m, "this_ms": round(medians[("this", m)], 3),
                          "other_ms": round(medians[("other", m)], 3),
                          "this_over_other": round(medians[("this", m)] /
                                                   medians[("other", m)], 3),
                          "same_bits": identical[m]}))
    if 1 in widths and 8 in widths:
        for name in builds:
            print(json.dumps({"build": name, "w8_over_step": round(
                medians[(name, 8)] / medians[(name, 1)], 3)}))
    return 0 if all(identical.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
