"""Tensor parallel over torch.distributed (gloo on CPU), where TP=N writes TP=1's bits.

Invariant (docs/TENSOR_PARALLEL.md): no dot product, norm or softmax is split across ranks.
Each rank computes whole output columns of every weight matrix with the arithmetic TP=1 uses
and the ranks gather them in rank order (a copy, never a sum), so every rank holds the bits
TP=1 holds after every op, and rank 0's logits and tokens are TP=1's.

    Generator.from_pretrained(model, tensor_parallel=2)   # under torchrun --nproc-per-node 2
    exactdraft.parallel.launch(main, 2)                    # or start the ranks from Python

Importing this package imports no torch; its modules do when used.
"""

from __future__ import annotations

from typing import Any

from exactdraft.parallel.settings import ParallelSettings, TensorParallelError

__all__ = ["ParallelSettings", "TensorParallelError", "launch"]


def launch(*args: Any, **kwargs: Any) -> list[int | None]:
    """exactdraft.parallel.ranks.launch: run a function in N local ranks."""
    from exactdraft.parallel.ranks import launch as run

    return run(*args, **kwargs)
