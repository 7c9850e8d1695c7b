"""What the torch CPU backend holds for a block-quantized GGUF matrix after load, against the
bytes the file stores for it, and the time of a one-row and an 8-row matmul with it.

Invariant measured alongside: nothing; this only counts bytes and times. A GGUF file with one
[N, K] matrix per format (gguf's quantization of a random matrix, or random blocks with small
float16 scales for the formats gguf does not quantize: neither size nor speed depends on the
values) is written to a temporary folder, read back kept in its blocks, and handed to
TorchCPUBackend().matrix, the call the backend makes for every weight at load; "held" is the
bytes of the arrays it keeps.

    python benchmarks/weight_memory.py [--formats q2_k,q3_k,q4_k,q6_k] [--shape 4096x4096]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from cpu_kernels import format_blocks


def held_bytes(matrix) -> int:
    parts = getattr(matrix, "packed", [matrix])
    return sum(part.data.nbytes for part in parts)


def best_seconds(call, repeat: int = 5) -> float:
    call()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def measure(format: str, shape: tuple[int, int], folder: Path) -> str:
    import gguf
    import torch

    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.loading.gguf import GGUFFile

    path = folder / f"{format}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    dense = np.random.default_rng(1).standard_normal(shape, dtype=np.float32) * 0.02
    writer.add_tensor("weight", format_blocks(format, dense),
                      raw_dtype=gguf.GGMLQuantizationType[format.upper()])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    file = GGUFFile(path)
    stored = file.tensors["weight"].size
    backend = TorchCPUBackend()
    matrix = backend.matrix(file.tensor("weight"))
    layouts = ",".join(part.layout for part in getattr(matrix, "packed", []))
    rng = np.random.default_rng(2)
    times = []
    for rows in (1, 8):
        x = torch.from_numpy(rng.standard_normal((rows, shape[1]), dtype=np.float32))
        times.append(best_seconds(lambda x=x: backend.linear(x, matrix)) * 1e6)
    held = held_bytes(matrix)
    return (f"{format:>6} {shape[0]}x{shape[1]} {stored / 2**20:9.2f} {held / 2**20:9.2f} "
            f"{held / stored:6.3f} {layouts:>8} {times[0]:9.1f} {times[1]:9.1f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="q2_k,q3_k,q4_k,q6_k")
    parser.add_argument("--shape", default="4096x4096", help="NxK")
    args = parser.parse_args(argv)
    from exactdraft.kernels import cpu

    shape = tuple(int(side) for side in args.shape.split("x"))
    print(f"simd={cpu.simd_level()} threads={cpu.num_threads()}")
    print(f"{'format':>6} {'NxK':>9} {'file MiB':>9} {'held MiB':>9} {'held/file':>6} "
          f"{'layout':>8} {'M=1 us':>9} {'M=8 us':>9}")
    with tempfile.TemporaryDirectory() as folder:
        for format in args.formats.split(","):
            print(measure(format, shape, Path(folder)), flush=True)


if __name__ == "__main__":
    main()
