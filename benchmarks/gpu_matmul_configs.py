"""Candidate configurations of the Triton matmul against cuBLAS, per weight shape, on one GPU:

    python benchmarks/gpu_matmul_configs.py [--shapes 2048x2048,8192x2048]

For each weight [N, K] (bf16) and each MatmulConfig in a small grid (BLOCK_N, BLOCK_K, warps,
stages; BLOCK_M stays 16, see matmul.py), prints cuBLAS time / kernel time at M = 1, 4, 16 and
64 (above 1: the kernel is faster; triton.testing.do_bench medians) and whether the
configuration keeps every row's bits at M = 1..17 and 33 (rows at offsets 0 and 7). The
configuration `matmul_config` picks today is marked with '*'. Exits 1 if a row-variant
configuration is the one in use.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from gpu_check import row_mismatch, rows_of  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from exactdraft.kernels.triton.matmul import MatmulConfig, matmul, matmul_config  # noqa: E402

SHAPES = "2048x2048,8192x2048,2048x8192,32000x2048,1536x576,576x1536"
ROW_COUNTS = (1, 4, 16, 64)


def candidates() -> list[MatmulConfig]:
    return [MatmulConfig(block_m=16, block_n=n, block_k=k, num_warps=w, num_stages=s)
            for n, k, w, s in itertools.product((16, 32, 64), (64, 128, 256), (2, 4), (4,))]


def median_ms(run) -> float:
    return do_bench(run, return_mode="median")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES, help="N x K weights, comma separated")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    generator = torch.Generator(device="cpu").manual_seed(0)
    in_use_variant = False
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = (torch.randn(n, k, generator=generator) * k ** -0.5).to("cuda", torch.bfloat16)
        x = torch.randn(72, k, generator=generator).to("cuda", torch.bfloat16)
        current = matmul_config(n, k, "bfloat16", "cuda")
        cublas = {m: median_ms(partial(torch.matmul, x[:m], w.T)) for m in ROW_COUNTS}
        print(f"N={n} K={k}: cuBLAS " + " ".join(f"M={m}:{t * 1e3:.1f}us"
                                                     for m, t in cublas.items()))
        for config in candidates():
            ours = partial(matmul, w=w, config=config)
            ratios = [cublas[m] / median_ms(partial(ours, x[:m])) for m in ROW_COUNTS]
            verdict = row_mismatch(rows_of(ours, x), 72, list(range(1, 18)) + [33])
            mark = "*" if config == current else " "
            in_use_variant |= config == current and verdict is not None
            print(f" {mark} n{config.block_n:<3} k{config.block_k:<3} w{config.num_warps} "
                  f"s{config.num_stages}  " + " ".join(f"{r:5.2f}" for r in ratios)
                  + ("  invariant" if verdict is None else f"  NOT invariant: {verdict}"))
    return 1 if in_use_variant else 0


if __name__ == "__main__":
    raise SystemExit(main())
