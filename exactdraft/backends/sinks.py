"""The sink logits a backend's attention takes (gpt-oss): one per query head, joining each
row's softmax denominator as one more logit with no value.

Invariant: every backend folds a head's sink into a row's softmax at the same place of its
order: the softmax's running max and sum start from the sink (max = sink, sum = exp(sink -
sink) = 1) before the first block of keys, so the keys' blocks then run as without sinks. A
backend declares `attention_sinks = True` when its `attention` takes `sinks`; a model with
sinks refuses any other (require_attention_sinks).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft.errors import BackendError


def sink_logits(sinks: Any, heads: int) -> np.ndarray:
    """The sinks as a contiguous float32 array [heads], or a BackendError naming what is
    wrong (their shape, or a logit that is not finite)."""
    logits = np.ascontiguousarray(sinks, dtype=np.float32)
    if logits.shape != (heads,):
        raise BackendError(f"attention sinks must have shape ({heads},) (one per query head), "
                           f"got {logits.shape}")
    if not np.isfinite(logits).all():
        raise BackendError(f"attention sinks must be finite, got {logits[~np.isfinite(logits)]}")
    return logits


def require_attention_sinks(backend: Any, model: str) -> None:
    """A BackendError unless `backend`'s attention takes sinks (its `attention_sinks`)."""
    if not getattr(backend, "attention_sinks", False):
        raise BackendError(f"{model} has attention sinks, which {backend!r} cannot run "
                           "(attention_sinks is not True); use the 'torch' or 'mlx' backend")
