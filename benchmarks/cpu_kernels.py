"""Micro-benchmark of the CPU matmul kernel against torch on the same machine, and the cost of a
SmolLM2 decode step and of W-row verify passes on the torch CPU backend.

Invariant measured alongside speed: nothing; this only times. The kernel is compared with
torch's `x @ W` in the two forms the torch backend can use: a one-row gemv (fast but not row
invariant) and the padded form (rows padded to a multiple of 4, the row-invariant baseline).
Quantized formats are compared with torch float32 on the dequantized weights; a "-dot" suffix
(q4_1-dot) packs them for the integer-dot kernel, which quantizes activations to int8. The
K-quants (q2_k .. q6_k), which gguf does not quantize, are timed on random blocks.

    python benchmarks/cpu_kernels.py [--threads N] [--repeat R] [--shapes 576x1536,...]
                                     [--formats f32,q4_1,q4_1-dot,...]
    python benchmarks/cpu_kernels.py --model [--repeat R] [--context C]

A shape KxN is x [M, K] times a weight [N, K]; bandwidth counts the weight bytes read once.
--model times, on the bundled SmolLM2-135M GGUF after a C-token prompt, a one-token decode step
(rows="last") and W-row passes (rows="all", W = 1, 2, 4, 8, 16) in ms, best of R, for the file's
quantized weights (int8 activations, and float32 activations) and for float32 weights.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

DEFAULT_SHAPES = ((576, 1536), (1536, 576), (576, 49152))
# Byte offsets of the float16 scales in the blocks of formats gguf does not quantize: those are
# timed on random blocks with small scales (the speed does not depend on the values).
# The formats gguf cannot quantize are timed on random blocks (the speed does not depend on the
# values): the byte offsets of their float16 fields.
RANDOM_BLOCK_HALVES = {"q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2),
                       "q6_k": (208,), "iq4_nl": (0,), "iq4_xs": (0,)}
DEFAULT_FORMATS = ("f32", "q4_1", "q4_1-dot")
VERIFY_WIDTHS = (1, 2, 4, 8, 16)


def best_seconds(call: Callable[[], object], repeat: int) -> float:
    """The fastest of `repeat` timed batches, each long enough to average a few calls."""
    call()
    start = time.perf_counter()
    call()
    once = max(time.perf_counter() - start, 1e-7)
    per_batch = max(1, int(0.02 / once))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(per_batch):
            call()
        best = min(best, (time.perf_counter() - start) / per_batch)
    return best


def random_blocks(format: str, shape: tuple[int, int]) -> np.ndarray:
    """uint8 rows [N, row bytes] of random `format` blocks with float16 scales near 2^-8."""
    from exactdraft.formats import FORMATS

    row = FORMATS[format]
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (shape[0] * shape[1] // row.block_size, row.block_bytes),
                          dtype=np.uint8)
    for offset in RANDOM_BLOCK_HALVES[format]:
        halves = (rng.uniform(0.5, 2.0, len(blocks)) * 2.0**-8).astype(np.float16)
        blocks[:, offset:offset + 2] = halves.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(shape[0], -1)


def format_blocks(format: str, dense: np.ndarray) -> np.ndarray:
    """uint8 rows of `format` blocks for a [N, K] matrix: gguf's quantization of `dense`,
    exactdraft's own for q1_0, random blocks for the formats gguf cannot quantize."""
    if format in RANDOM_BLOCK_HALVES:
        return random_blocks(format, dense.shape)
    if format == "q1_0":  # gguf has no q1_0 quantizer
        from exactdraft.formats.ternary_blocks import quantize_q1_0

        return quantize_q1_0(dense)
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    return quantize(dense, getattr(GGMLQuantizationType, format.upper()))


def weight_for(format: str, dense: np.ndarray) -> tuple[object, np.ndarray]:
    """The packed weight and the float32 values torch multiplies by."""
    from exactdraft.formats import QuantizedTensor
    from exactdraft.kernels import cpu

    format, dot = format.removesuffix("-dot"), format.endswith("-dot")
    if format == "f32":
        return cpu.pack_matrix(dense), dense
    if format == "bf16":
        patterns = (dense.view(np.uint32) >> 16).astype(np.uint16)
        return cpu.pack_matrix(patterns, "bf16"), (patterns.astype(np.uint32) << 16).view(
            np.float32)
    tensor = QuantizedTensor(format, format_blocks(format, dense), dense.shape)
    return cpu.pack_matrix(tensor, layout="dot" if dot else "grouped"), tensor.dequantize()


def measure(format: str, depth: int, columns: int, repeat: int, rng) -> str:
    """One result line for a weight [columns, depth] in `format`."""
    import torch

    from exactdraft.kernels import cpu

    packed, values = weight_for(format, rng.standard_normal((columns, depth), dtype=np.float32))
    torch_weight = torch.from_numpy(np.ascontiguousarray(values.T))
    x = {m: rng.standard_normal((m, depth), dtype=np.float32) for m in (1, 4, 8, 16)}
    out = {m: np.empty((m, columns), dtype=np.float32) for m in x}
    ours = {m: best_seconds(lambda m=m: cpu.matmul(x[m], packed, out=out[m]), repeat)
            for m in (1, 8, 16)}
    one_row, four_rows = torch.from_numpy(x[1]), torch.from_numpy(x[4])
    gemv = best_seconds(lambda: one_row @ torch_weight, repeat)
    padded = best_seconds(lambda: four_rows @ torch_weight, repeat)
    return (f"{depth:>5}x{columns:<6} {format:>8} {ours[1] * 1e6:8.1f} "
            f"{packed.data.nbytes / ours[1] / 1e9:6.1f} {gemv / ours[1]:13.2f} "
            f"{padded / ours[1]:13.2f} {ours[8] / ours[1]:8.2f} {ours[16] / ours[1]:8.2f}")


def run(shapes: tuple[tuple[int, int], ...], formats: tuple[str, ...], threads: int | None,
        repeat: int) -> list[str]:
    import torch

    from exactdraft.kernels import cpu

    if not cpu.available():
        return [f"CPU kernels unavailable: {cpu.unavailable_reason()}"]
    if threads:
        cpu.set_num_threads(threads)
        torch.set_num_threads(threads)
    lines = [f"simd={cpu.simd_level()} threads={cpu.num_threads()} torch_threads="
             f"{torch.get_num_threads()}",
             f"{'shape KxN':>12} {'format':>8} {'M=1 us':>8} {'GB/s':>6} {'vs torch gemv':>13} "
             f"{'vs torch pad4':>13} {'M=8/M=1':>8} {'M=16/M=1':>8}"]
    rng = np.random.default_rng(0)
    for depth, columns in shapes:
        for format in formats:
            lines.append(measure(format, depth, columns, repeat, rng))
    return lines


def model_passes(target, context: int, repeat: int) -> dict[str, float]:
    """Best-of-`repeat` ms of a decode step and of W-row verify passes after `context` tokens."""
    state = target.new_state()
    target.forward(state, [(5 * i + 11) % target.vocab_size for i in range(context)])

    def best(tokens: list[int], rows: str) -> float:
        fastest = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            target.forward(state, tokens, rows=rows)
            fastest = min(fastest, time.perf_counter() - start)
            target.truncate(state, context)
        return fastest * 1e3

    best([17], "last")  # warm-up: threads awake, caches and allocator in their steady state
    times = {"step": best([17], "last")}
    for width in VERIFY_WIDTHS:
        times[f"W={width}"] = best([(7 * i + 3) % target.vocab_size for i in range(width)], "all")
    return times


def run_model(context: int, repeat: int) -> list[str]:
    """Result lines of --model: one per weight kind, times in ms."""
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.models.families.llama import build as build_llama
    from exactdraft.pretrained import load_checkpoint

    lines = [f"SmolLM2-135M, {context}-token context, best of {repeat}, ms"]
    for label, quantized, options in (("q4_1 int8 activations", True, {}),
                                      ("q4_1 float activations", True,
                                       {"quantized_activations": False}),
                                      ("float32 weights", False, {})):
        checkpoint = load_checkpoint(None, keep_quantized=quantized)
        target = build_llama(checkpoint.config, checkpoint.tensors, TorchCPUBackend(**options))
        times = model_passes(target, context, repeat)
        cells = " ".join(f"{name} {value:.2f}" for name, value in times.items())
        lines.append(f"{label:>23}: {cells}  W=8/step {times['W=8'] / times['step']:.2f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in DEFAULT_SHAPES))
    parser.add_argument("--formats", default=",".join(DEFAULT_FORMATS),
                        help="any of f32, bf16, q8_0, q4_0, q4_1, and <block format>-dot "
                             "(q8_0-dot, q4_1-dot, q6_k-dot, iq4_nl-dot, mxfp4-dot, tq1_0-dot, "
                             "...; K a multiple of the format's block)")
    parser.add_argument("--model", action="store_true",
                        help="time SmolLM2 decode steps and verify passes instead")
    parser.add_argument("--context", type=int, default=200)
    args = parser.parse_args(argv)
    if args.model:
        if args.threads:
            from exactdraft.kernels import cpu

            cpu.set_num_threads(args.threads)
        for line in run_model(args.context, args.repeat):
            print(line)
        return
    shapes = tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(","))
    print("ratios > 1 mean the kernel is faster than torch")
    for line in run(shapes, tuple(args.formats.split(",")), args.threads, args.repeat):
        print(line)


if __name__ == "__main__":
    main()
