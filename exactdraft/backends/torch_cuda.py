"""The torch backend on device "cuda", computing through row-invariant Triton kernels.

Invariant (INVARIANCE.md): each op gives a row the same bits whatever the number of rows in the
call and wherever the row sits. linear, rms_norm and attention run the kernels in
exactdraft.kernels.triton, whose module docstrings carry the argument (one configuration per
weight or head layout, no split-K, fixed reductions, attention chunks aligned to absolute
positions). The remaining ops are torch elementwise or indexing ops: on CUDA every element is
computed by the same scalar code whichever row it sits in (vectorisation there only widens the
loads, it does not switch to another math routine as CPU SIMD loops do), so rope, silu_mul,
embedding and residual adds are row invariant too; the model-level check on the GPU covers them.

On device "cpu" the same kernels run through Triton's interpreter (TRITON_INTERPRET=1 before
triton is imported), with the rowwise dot step, so that a small model can run end to end on a
machine without a GPU. That mode exists for tests; it is slow.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft.backends.base import BackendError, dense_matrix
from exactdraft.backends.sinks import sink_logits
from exactdraft.backends.torch_backend import TorchBackend


def _torch():
    import torch

    return torch


class TorchCudaBackend(TorchBackend):
    """Row-invariant ops on torch tensors through Triton kernels (device cuda, or cpu under the
    Triton interpreter)."""

    name = "torch"

    default_device = "cuda"
    default_dtype = "bfloat16"

    def __init__(self, device: str | None = None, dtype: str | None = None,
                 key_block: int | None = None, dot: str = "auto") -> None:
        torch = _torch()
        try:
            from exactdraft.kernels.triton import attention, launch, matmul, norm
        except ImportError as error:
            raise BackendError(
                f"the torch backend on {device or self.default_device!r} needs the 'triton' "
                f"package ({error}); install it with: pip install triton"
            ) from error
        if dot not in launch.DOT_MODES:
            raise BackendError(f"unknown dot mode {dot!r}; known: {', '.join(launch.DOT_MODES)}")
        self._attention, self._matmul, self._norm, self._launch = attention, matmul, norm, launch
        # KV buffers grow in whole attention chunks; any capacity would be correct, since the
        # kernel masks by position, but whole chunks keep reads of a row's last chunk in bounds.
        super().__init__(device, dtype, key_block or attention.CHUNK)
        self.dot = dot
        # Row invariance holds per device family; bits may differ between GPU models.
        where = torch.cuda.get_device_name(self.torch_device) \
            if self.torch_device.type == "cuda" else "interpreter"
        self.arithmetic = f"triton-{where}-{self.dtype}-{dot}"

    def checked_device(self, torch: Any) -> Any:
        try:
            torch_device = torch.device(self.device)
        except RuntimeError as error:
            raise BackendError(f"unknown torch device {self.device!r} ({error})") from None
        if torch_device.type == "cuda" and not torch.cuda.is_available():
            raise BackendError(f"device {self.device!r} asked for, but torch sees no CUDA device")
        if torch_device.type not in ("cuda", "cpu"):
            raise BackendError(f"torch cuda backend device {self.device!r} is not supported; "
                               "supported: cuda, cuda:N, cpu (Triton interpreter)")
        if torch_device.type == "cpu" and \
                not self._launch.interpreted(self._matmul._matmul_kernel):
            raise BackendError(
                "the Triton kernels run on CPU tensors only under Triton's interpreter: set "
                "TRITON_INTERPRET=1 in the environment before triton is first imported"
            )
        return torch_device

    def __repr__(self) -> str:
        return f"TorchCudaBackend(device={self.device!r}, dtype={self.dtype!r})"

    # -- weights ---------------------------------------------------------------------------

    def matrix(self, weight: Any) -> Any:
        torch = _torch()
        dense = dense_matrix(weight)
        # Kept as [N, K], the layout the matmul kernel reads along K.
        return torch.from_numpy(dense).to(self.torch_device, self.torch_dtype).contiguous()

    # -- ops (embedding, rope, silu_mul and KV writes are the torch ops of TorchBackend) ----

    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        return self._matmul.matmul(x, weight, bias, dot=self.dot)

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        return self._norm.rms_norm(x, weight, eps)

    def attention(self, q: Any, keys: Any, values: Any, positions: np.ndarray,
                  window: int, scale: float, sinks: np.ndarray | None = None) -> Any:
        if sinks is not None:
            sinks = sink_logits(sinks, q.shape[1])
        return self._attention.attention(q, keys, values, np.asarray(positions, dtype=np.int64),
                                         scale, int(window), dot=self.dot, sinks=sinks)
