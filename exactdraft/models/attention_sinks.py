"""Attention with sinks (gpt-oss): a learned logit per query head that joins every row's softmax
denominator and carries no value.

Invariant: a row's attended output has the bits it gets when its sequence runs alone and the row
is computed by itself, on every backend: the sinks go into the backend's own row invariant
attention (`attention(..., sinks=...)`, backends/sinks.py), which folds a head's sink into each
row's softmax at one fixed place of its canonical order, before the keys (the running max and
sum start from the sink), so neither the number of rows in the pass nor the cache length
changes a row's bits. Token trees keep them too: a tree row reads its ancestors' keys in the
backend's tree attention and the sink joins its softmax as in a serial step over its path.
The sinks cost the attention no measurable time (benchmarks/sink_attention.py).

A backend whose attention takes no sinks (attention_sinks is not True: a registered backend
that does not declare them) is refused when the model is built (require_attention_sinks),
never run without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.backends.base import Backend
from exactdraft.models.blocks import RopeTable
from exactdraft.models.mixers import AttentionMixer, PassContext


class _WithSinks:
    """The backend as the wrapped attention mixer sees it: every op its own, attention with
    the heads' sinks [Hq] (float32)."""

    def __init__(self, backend: Backend, sinks: np.ndarray) -> None:
        self._backend = backend
        self._sinks = sinks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def attention(self, q: Any, keys: Any, values: Any, positions: np.ndarray, window: int,
                  scale: float, tree_paths: np.ndarray | None = None) -> Any:
        tree = {} if tree_paths is None else {"tree_paths": tree_paths}
        return self._backend.attention(q, keys, values, positions, window, scale,
                                       sinks=self._sinks, **tree)


@dataclass
class SinkAttention:
    """An AttentionMixer whose heads have sinks [Hq] (float32 logits)."""

    attention: AttentionMixer
    sinks: np.ndarray

    def __post_init__(self) -> None:
        self.sinks = np.ascontiguousarray(self.sinks, dtype=np.float32)

    @property
    def rope(self) -> RopeTable | None:
        return self.attention.rope

    def run(self, be: Backend, x: Any, ctx: PassContext) -> Any:
        return self.attention.run(_WithSinks(be, self.sinks), x, ctx)
