"""From a checkpoint to a tensor-parallel model: check the split, join the ranks, agree on the
fingerprint, load this rank's columns, then drive (rank 0) or follow (the others).

Invariant: a split that cannot be made is refused before a rank joins or a weight is read
(ParameterError naming the rank count and what it exceeds); ranks whose files or settings
differ stop before loading (TensorParallelError naming the rank); each rank reads and keeps
only its own output columns of every weight matrix (sharding.py) plus the replicated vectors
and the embedding rows a pass looks up.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

from exactdraft.errors import ParameterError
from exactdraft.parallel.settings import ParallelSettings, parallel_settings

# Families whose models TP splits today (dense decoders, models/decoder.py).
DENSE_CONFIG = "DecoderConfig"


def check_split(config: Any, tensor_parallel: int | ParallelSettings) -> ParallelSettings:
    """The settings, once the model can be split that many ways; else a ParameterError."""
    settings = parallel_settings(tensor_parallel)
    n = settings.world_size
    if type(config).__name__ != DENSE_CONFIG:
        raise ParameterError(
            f"tensor_parallel={n}: {getattr(config, 'model_type', type(config).__name__)!r} "
            "models are not split yet; tensor parallel supports the dense decoder families "
            "(llama, mistral, qwen2, qwen3, gemma3)")
    if n == 1:
        return settings
    if n > config.num_heads:
        raise ParameterError(f"tensor_parallel={n} exceeds the model's {config.num_heads} "
                             "attention heads")
    from exactdraft.parallel.sharding import column_ranges

    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    for what, columns in (("q, k and v projection", q + 2 * kv),
                          ("hidden size", config.hidden_size),
                          ("gate and up projection", 2 * config.intermediate_size),
                          ("vocabulary", config.vocab_size)):
        try:
            column_ranges(columns, n)
        except ParameterError as error:
            raise ParameterError(f"tensor_parallel={n} cannot split the {what}: "
                                 f"{error}") from None
    return settings


def kernel_threads(settings: ParallelSettings) -> int:
    """C kernel threads for this rank: the setting, or this machine's CPUs shared evenly by
    the ranks on it (LOCAL_WORLD_SIZE, as torchrun and launch set it)."""
    if settings.threads_per_rank is not None:
        return settings.threads_per_rank
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", settings.world_size))
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    return max(1, available // max(1, local_ranks))


def build_parallel_target(checkpoint: Any, backend: Any, tensor_parallel: Any, *,
                          max_context: int | None = None, followers_exit: bool = True) -> Any:
    """On rank 0 the TensorParallelTarget; on the other ranks, follow rank 0 until it closes
    the run, then exit the process (SystemExit(0)) or, with followers_exit=False, return
    None. A script run under torchrun thus reads like a one-process script."""
    from exactdraft.kernels import cpu
    from exactdraft.models.decoder import DecoderModel
    from exactdraft.parallel.backend import GatheringBackend
    from exactdraft.parallel.fingerprint import run_fingerprint
    from exactdraft.parallel.group import ParallelGroup
    from exactdraft.parallel.target import TensorParallelTarget, follow

    settings = check_split(checkpoint.config, tensor_parallel)
    group = ParallelGroup(settings)
    try:
        cpu.set_num_threads(kernel_threads(settings))
        wrapped = GatheringBackend(backend, group)
        group.agree("checkpoint and settings",
                    run_fingerprint(checkpoint, backend, settings.world_size, max_context))
        model = checkpoint.family.build(checkpoint.config, checkpoint.tensors, wrapped,
                                        max_context)
        if type(model) is not DecoderModel:
            raise ParameterError(f"tensor parallel splits dense decoder models, not {model!r}")
        group.barrier("loading")
    except BaseException:
        group.close()
        raise
    if group.rank == 0:
        target = TensorParallelTarget(model, group)
        atexit.register(target.close)
        return target
    follow(model, group)
    if followers_exit:
        raise SystemExit(0)
    return None
