"""Tensor parallel on CUDA GPUs with NCCL: does TP=2 write TP=1's bits with the Triton kernels?

    python benchmarks/gpu_tp_check.py [--quick]                         # one GPU: part 1
    torchrun --nproc-per-node 2 benchmarks/gpu_tp_check.py [--quick]    # two GPUs: parts 1, 2

Nothing depends on this script; it is for a machine with GPUs. Part 1 (every rank, one GPU
each): for each weight shape of the model, whether the columns a rank computes from its slice
of the weight (sharding.column_ranges) have the bytes of the same columns computed from the
whole weight, at 1 and 8 rows: the property TP's exactness rests on, which the CPU kernels
have by construction and the Triton matmul must show (it picks its tile configuration from the
weight's shape). Part 2 (two ranks): a random llama of the given shape (default about 3.5 B
parameters in bf16, so each rank's half fills a good part of a device; --quick: a small one),
whose weights each rank generates from fixed seeds, split with exactdraft.parallel's
GatheringBackend over an NCCL all_gather; rank 0 also runs it whole (TP=1) on its GPU first.
Printed: whether the prefill and greedy decode logits have TP=1's bytes, the greedy tokens, and
decode tokens/s for both. With fewer GPUs than ranks the ranks share them and gather through
host memory with gloo: the same bits (a gather is a copy), not NCCL's speed. Exit status 0 when
every comparison is equal, 1 when one differs, 2 when CUDA is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {"full": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                       num_layers=12, num_heads=32, num_kv_heads=8, head_dim=128),
          "quick": dict(vocab_size=4096, hidden_size=1024, intermediate_size=2816,
                        num_layers=4, num_heads=16, num_kv_heads=4, head_dim=64)}


class RandomTensors(Mapping):
    """A llama checkpoint's tensors, each drawn on access from a seed of its name, so every
    rank sees the same values without a file; shape() answers without drawing."""

    def __init__(self, config: Any) -> None:
        from exactdraft.models.decoder import TensorNames

        self.shapes = TensorNames().expected_shapes(config)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def __getitem__(self, name: str) -> np.ndarray:
        shape = self.shapes[name]
        rng = np.random.default_rng(sum(name.encode()) * 1_000_003 + len(name))
        if len(shape) == 1:
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        return (rng.standard_normal(shape, dtype=np.float32) * (1.2 / shape[1] ** 0.5))

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


class NcclGroup:
    """What GatheringBackend needs of a group, over NCCL, or over gloo through host memory
    when ranks share a GPU (no heartbeat: a check script)."""

    def __init__(self, rank: int, world_size: int, host: bool) -> None:
        self.rank, self.world_size, self.bytes_sent, self.host = rank, world_size, 0, host

    def all_gather_columns(self, local: Any, widths: list[int]) -> Any:
        import torch
        import torch.distributed as dist

        widest = max(widths)
        send = torch.nn.functional.pad(local, (0, widest - local.shape[1])).contiguous()
        device = send.device
        if self.host:
            send = send.cpu()
        blocks = [torch.empty_like(send) for _ in widths]
        dist.all_gather(blocks, send)
        return torch.cat([block[:, :width] for block, width in zip(blocks, widths)],
                         dim=1).to(device)


def column_check(backend: Any, config: Any, world_size: int) -> bool:
    """Part 1: every rank's columns from its slice equal the whole weight's columns."""
    import torch

    from exactdraft.parallel.sharding import column_ranges

    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    shapes = {"qkv": (q + 2 * kv, config.hidden_size), "output": (config.hidden_size, q),
              "gate_up": (2 * config.intermediate_size, config.hidden_size),
              "down": (config.hidden_size, config.intermediate_size),
              "lm_head": (config.vocab_size, config.hidden_size)}
    rng, every = np.random.default_rng(0), True
    for name, (columns, depth) in shapes.items():
        weight = rng.standard_normal((columns, depth), dtype=np.float32) / depth ** 0.5
        whole = backend.matrix(weight)
        for rows in (1, 8):
            x = torch.from_numpy(rng.standard_normal((rows, depth), dtype=np.float32)).to(
                backend.torch_device, backend.torch_dtype)
            full = backend.linear(x, whole)
            for rank, (start, end) in enumerate(column_ranges(columns, world_size)):
                part = backend.linear(x, backend.matrix(weight[start:end]))
                whole_part = full[:, start:end].contiguous()
                same = torch.equal(part.contiguous().view(torch.uint8),
                                   whole_part.view(torch.uint8))
                every &= same
                print(f"part 1  {name:8s} [{columns}x{depth}] rows {rows} rank {rank} columns "
                      f"{start}:{end}  {'equal' if same else 'DIFFERENT'}")
    return every


def run_model(model: Any, prompt: list[int], steps: int) -> tuple[np.ndarray, list[int], float]:
    """(logits of the prefill and of each greedy step, the greedy tokens, decode tokens/s)."""
    state = model.new_state()
    logits = [model.forward(state, prompt)]
    tokens: list[int] = []
    start = time.perf_counter()
    for _ in range(steps):
        tokens.append(int(np.argmax(logits[-1][-1])))
        logits.append(model.forward(state, [tokens[-1]]))
    return np.concatenate(logits), tokens, steps / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model")
    parser.add_argument("--steps", type=int, default=32, help="greedy decode steps")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_tp_check: no CUDA device is visible; this check needs CUDA GPUs "
              "(one for part 1, two for part 2)")
        return 2
    from exactdraft.backends.torch_cuda import TorchCudaBackend
    from exactdraft.models.config import DecoderConfig
    from exactdraft.models.decoder import DecoderModel
    from exactdraft.parallel.backend import GatheringBackend

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    shared = world_size > torch.cuda.device_count()  # ranks share GPUs: gloo via the host
    if shared:
        print(f"gpu_tp_check: {world_size} ranks, {torch.cuda.device_count()} GPU(s): ranks "
              "share GPUs and gather through host memory with gloo (same bits, slower)")
        local_rank %= torch.cuda.device_count()
    device = f"cuda:{local_rank}"
    torch.cuda.set_device(device)
    config = DecoderConfig(model_type="llama", rms_norm_eps=1e-5, rope_theta=500000.0,
                           max_position_embeddings=4096, **SHAPES["quick" if args.quick
                                                                  else "full"])
    backend = TorchCudaBackend(device=device, dtype="bfloat16")
    every = column_check(backend, config, max(world_size, 2))
    if world_size < 2:
        print("part 2 needs two ranks: torchrun --nproc-per-node 2 benchmarks/gpu_tp_check.py")
        return 0 if every else 1
    import torch.distributed as dist

    if shared:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("nccl", device_id=torch.device(device))
    tensors = RandomTensors(config)
    prompt = [(31 * i + 7) % config.vocab_size for i in range(64)]
    reference = None
    if rank == 0:
        whole = DecoderModel(config, tensors, backend)
        reference = run_model(whole, prompt, args.steps)
        del whole
        torch.cuda.empty_cache()

    class NcclGathering(GatheringBackend):
        def __init__(self, inner: Any, group: Any) -> None:  # any torch backend, for the check
            self.inner, self.group, self.matrix_bytes = inner, group, 0

    split = NcclGathering(backend, NcclGroup(rank, world_size, shared))
    model = DecoderModel(config, tensors, split)
    logits, tokens, speed = run_model(model, prompt, args.steps)
    dist.barrier()
    if rank != 0:
        dist.destroy_process_group()
        return 0
    same_logits = logits.tobytes() == reference[0].tobytes()
    same_tokens = tokens == reference[1]
    print(f"part 2  {config.num_layers} layers, hidden {config.hidden_size}, weight bytes per "
          f"rank {split.matrix_bytes / 2**30:.2f} GiB")
    print(f"part 2  logits equal to TP=1: {same_logits}; greedy tokens equal: {same_tokens}")
    print(f"part 2  decode tokens/s: TP=1 {reference[2]:.1f}, TP={world_size} {speed:.1f}")
    dist.destroy_process_group()
    return 0 if every and same_logits and same_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
