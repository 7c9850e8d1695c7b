"""The torch backend on device "cpu" with exactdraft's own C kernels (csrc/cpu).

Invariant (INVARIANCE.md): linear, rms_norm, rope, silu_mul and attention run through kernels
that are row invariant by construction (each output element's K order depends on K and the
weight format only; attention reads fixed tiles aligned to absolute positions and nothing past
a row's own position; thread partitions follow the weight shape), so no row ever depends on
the row count, its place in the pass, or the thread count. Weights stay in their stored format:
float32, bfloat16 (dtype="bfloat16"), or GGUF q8_0/q4_0/q4_1 blocks when a checkpoint is
loaded with keep_quantized=True; activations and the KV cache are float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft.backends.base import BackendError
from exactdraft.backends.torch_backend import TorchBackend
from exactdraft.kernels import cpu
from exactdraft.models.weights import QuantizedTensor


class TorchCPUBackend(TorchBackend):
    """Torch tensors on the CPU, computed by the C kernels."""

    name = "torch"

    def __init__(self, device: str | None = None, dtype: str | None = None,
                 key_block: int = 256) -> None:
        if not cpu.available():
            raise BackendError(f"the C kernels are unavailable: {cpu.unavailable_reason()}")
        if (dtype or "float32") not in ("float32", "bfloat16"):
            raise BackendError(f"the C kernels keep weights in float32 or bfloat16, not {dtype!r}")
        super().__init__(device=device, dtype=dtype, key_block=key_block)
        import torch

        self._torch = torch

    def __repr__(self) -> str:
        return f"TorchCPUBackend(dtype={self.dtype!r}, simd={cpu.simd_level()!r})"

    def matrix(self, weight: Any) -> Any:
        if isinstance(weight, QuantizedTensor):
            return cpu.pack_matrix(weight)
        dense = np.array(weight, dtype=np.float32)
        if dense.ndim != 2:
            raise BackendError(f"a weight matrix must be 2-D, got shape {dense.shape}")
        if self.dtype == "bfloat16":
            return cpu.pack_matrix(self._torch.from_numpy(dense).bfloat16())
        return cpu.pack_matrix(dense)

    def vector(self, values: np.ndarray) -> Any:
        return self._torch.from_numpy(np.array(values, dtype=np.float32))

    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        return cpu.matmul(x, weight, bias)

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        shape = x.shape
        return cpu.rms_norm(x.contiguous().view(-1, shape[-1]), weight, eps).view(shape)

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        return cpu.rope(x.contiguous(), cos, sin)

    def silu_mul(self, gate_up: Any) -> Any:
        return cpu.silu_mul(gate_up)

    def kv_buffer(self, num_kv_heads: int, capacity: int, head_dim: int,
                  previous: Any | None = None) -> Any:
        buffer = self._torch.zeros(num_kv_heads, capacity, head_dim)
        if previous is not None:
            buffer[:, : previous.shape[1]] = previous
        return buffer

    def attention(self, q: Any, keys: Any, values: Any, positions: np.ndarray,
                  window: int, scale: float) -> Any:
        if int(positions.max()) >= keys.shape[1]:
            raise BackendError(f"KV buffer of {keys.shape[1]} positions cannot hold key "
                               f"{int(positions.max())}")
        return cpu.attention(q.contiguous(), keys, values, positions, window, scale)

    def to_host(self, x: Any) -> np.ndarray:
        return x.numpy()
