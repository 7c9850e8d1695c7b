"""The torch CPU backend's float kernel on a block-scaled FP8 matrix held as fp8_e4m3 blocks,
side by side with the same matrix dequantized to float32 (what keep_quantized=False holds):
bytes held against the file's, and the time of a one-row and an 8-row matmul.

Invariant measured alongside: the two give the same output bytes (checked, not timed). The
matrix is random e4m3fn codes (no NaN code) with one float32 scale per 128x128 block, as
DeepSeek-V3 and Qwen3 FP8 checkpoints store them.

    python benchmarks/fp8_matmul.py [--shape 4096x4096] [--repeat 5]
"""

from __future__ import annotations

import argparse

import numpy as np
from weight_memory import best_seconds, held_bytes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4096x4096", help="NxK")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    import torch

    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.kernels import cpu
    from exactdraft.loading.fp8_blocks import dequantize_blocks, fp8_e4m3_matrix

    rows, depth = (int(side) for side in args.shape.split("x"))
    block = (128, 128)
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 256, (rows, depth), dtype=np.uint8)
    codes[(codes & 0x7F) == 0x7F] ^= 0x01  # no NaN code
    scales = rng.uniform(2.0 ** -10, 2.0 ** -8, (-(-rows // 128), -(-depth // 128)))
    scales = scales.astype(np.float32)
    stored = codes.nbytes + scales.nbytes
    backend = TorchCPUBackend()
    matrices = {"fp8_e4m3": backend.matrix(fp8_e4m3_matrix(codes, scales, block)),
                "f32": backend.matrix(dequantize_blocks(codes, scales, block))}
    print(f"simd={cpu.simd_level()} threads={cpu.num_threads()} shape={rows}x{depth} "
          f"file={stored / 2**20:.2f} MiB")
    print(f"{'held as':>9} {'held MiB':>9} {'held/file':>9} {'M=1 us':>9} {'M=8 us':>9}")
    outputs: dict[str, list[bytes]] = {}
    for name, matrix in matrices.items():
        held = held_bytes(matrix)
        times = []
        for m in (1, 8):
            x = torch.from_numpy(np.random.default_rng(m).standard_normal((m, depth),
                                                                          dtype=np.float32))
            outputs.setdefault(name, []).append(backend.linear(x, matrix).numpy().tobytes())
            seconds = best_seconds(lambda x=x, w=matrix: backend.linear(x, w), args.repeat)
            times.append(seconds * 1e6)
        print(f"{name:>9} {held / 2**20:9.2f} {held / stored:9.3f} {times[0]:9.1f} "
              f"{times[1]:9.1f}", flush=True)
    same = outputs["fp8_e4m3"] == outputs["f32"]
    print(f"same output bytes for M=1 and M=8: {same}")


if __name__ == "__main__":
    main()
