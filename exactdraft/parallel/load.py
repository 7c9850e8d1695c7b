"""From a checkpoint to a tensor-parallel model: check the split, join the ranks, agree on the
fingerprint, load this rank's columns, then drive (rank 0) or follow (the others).

Invariant: a split that cannot be made is refused before a rank joins or a weight is read
(ParameterError naming the rank count and what it exceeds, or the family not split yet); ranks
whose files or settings differ stop before loading (TensorParallelError naming the rank); each
rank keeps only its own output columns of every weight matrix (sharding.py), or its heads' rows
(heads.py, recurrent_heads.py), or its experts whole (experts.py), plus the replicated vectors
and the embedding rows a pass looks up.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
from typing import Any

from exactdraft.errors import ParameterError
from exactdraft.models.split import not_split
from exactdraft.parallel.settings import ParallelSettings, parallel_settings


def check_split(family: Any, config: Any,
                tensor_parallel: int | ParallelSettings) -> ParallelSettings:
    """The settings, once the model can be split that many ways (its family declares how:
    models/split.py); else a ParameterError."""
    settings = parallel_settings(tensor_parallel)
    n = settings.world_size
    if family.tensor_parallel(config) is None:
        model_type = getattr(config, "model_type", family.name)
        raise ParameterError(
            f"tensor_parallel={n}: {model_type!r} models are not split yet (the {family.name} "
            "family declares no tensor-parallel split); tensor parallel supports "
            f"{', '.join(split_model_types())}")
    if n > config.num_heads:
        raise ParameterError(f"tensor_parallel={n} exceeds the model's {config.num_heads} "
                             "attention heads")
    return settings


def split_model_types() -> list[str]:
    """The model types whose families declare a split for their own configurations."""
    from exactdraft.models.families.registry import family_for_model_type, supported_model_types

    return [t for t in supported_model_types()
            if family_for_model_type(t, "<registry>").tensor_parallel is not not_split]


def kernel_threads(settings: ParallelSettings) -> int:
    """C kernel threads for this rank: the setting, or this machine's CPUs shared evenly by
    the ranks on it (LOCAL_WORLD_SIZE, as torchrun and launch set it)."""
    if settings.threads_per_rank is not None:
        return settings.threads_per_rank
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", settings.world_size))
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    return max(1, available // max(1, local_ranks))


def build_split_model(checkpoint: Any, backend: Any, max_context: int | None = None) -> Any:
    """This rank's part of the model on a GatheringBackend, as its family declares the split
    (models/split.py): attention split by heads when the ranks divide the KV heads of a dense
    decoder (heads.py), else every rank attends with every head; whole experts per rank
    (experts.py); the recurrent and attention layers of a hybrid split by head group where the
    ranks divide their heads (recurrent_heads.py, attention_heads.py); every other weight
    matrix split by output columns."""
    from exactdraft.parallel.attention_heads import split_attention_layers
    from exactdraft.parallel.experts import place_experts
    from exactdraft.parallel.heads import HeadRange, HeadSplitDecoderModel, splits_heads
    from exactdraft.parallel.recurrent_heads import split_recurrent_layers

    config, group = checkpoint.config, backend.group
    split = checkpoint.family.tensor_parallel(config)
    if split.heads is not None and splits_heads(config, group.world_size):
        heads = HeadRange(group.rank, group.world_size, config.num_heads, config.num_kv_heads,
                          config.head_dim)
        return HeadSplitDecoderModel(config, checkpoint.tensors, backend, max_context,
                                     split.heads, heads)
    model = checkpoint.family.build(config, checkpoint.tensors, backend, max_context)
    if split.experts is not None:
        place_experts(model, checkpoint, backend, split.experts)
    if split.recurrent is not None:
        split_recurrent_layers(model, checkpoint, backend, split.recurrent)
    if split.attention is not None:
        split_attention_layers(model, checkpoint, backend, split.attention)
    if model.mtp is not None:
        # The checkpoint's MTP layers draft on rank 0's backend only, which TP does not
        # replay on the other ranks (target.py declares no MTP): not kept.
        model.mtp = None
        model.trunk = dataclasses.replace(model.trunk, mtp=None)
    return model


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
    from exactdraft.parallel.heads import HeadSplitDecoderModel
    from exactdraft.parallel.target import TensorParallelTarget, follow

    settings = check_split(checkpoint.family, checkpoint.config, tensor_parallel)
    group = ParallelGroup(settings)
    try:
        cpu.set_num_threads(kernel_threads(settings))
        wrapped = GatheringBackend(backend, group)
        group.agree("checkpoint and settings",
                    run_fingerprint(checkpoint, backend, settings.world_size, max_context))
        model = build_split_model(checkpoint, wrapped, max_context)
        # A DecoderModel or a subclass of it (Gemma 4's per-layer inputs, a latent attention
        # model's LatentCache): the split acts on the layers DecoderModel holds.
        if not isinstance(model, (DecoderModel, HeadSplitDecoderModel)) or model.mtp is not None:
            raise ParameterError(f"tensor parallel cannot split {model!r}")
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
