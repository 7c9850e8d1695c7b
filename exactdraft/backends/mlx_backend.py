"""The mlx backend: device "cpu" on MLX's own ops, device "gpu" on exactdraft's Metal shaders.

Invariant (INVARIANCE.md): each op gives a row the same bits whatever the number of rows in the
call. On device "cpu" that rests on MLX's CPU build, whose matmul, quantized matmul, reductions
and elementwise ops were measured row invariant (a reference BLAS, no row-count dispatch); the
load-time guard re-checks it on the loaded weights every time, because a new MLX release may
change it. On device "gpu" MLX's own quantized matmul and attention pick kernels by row count,
so linear, rms_norm and attention run through the shaders in csrc/metal instead. Attention on
either device reduces keys in fixed blocks aligned to absolute positions, exactly as the torch
backend does, so keys past a row's own position never change its bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft.backends.base import BackendError, register_backend
from exactdraft.models.weights import AffineQuantizedTensor, QuantizedTensor, affine_from_blocks

# MLX releases whose CPU ops (and, on Apple Silicon, whose metal_kernel interface) this backend
# was checked against. Others still run, but only after the load-time guard passes.
CHECKED_MLX_VERSIONS = ("0.32.4",)


def _mx():
    import mlx.core as mx

    return mx


class QuantizedLinear:
    """An affine-quantized weight as MLX arrays."""

    def __init__(self, weight: AffineQuantizedTensor) -> None:
        mx = _mx()
        self.packed = mx.array(weight.packed)
        self.scales = mx.array(weight.scales)
        self.biases = mx.array(weight.biases)
        self.group_size, self.bits = weight.group_size, weight.bits
        self.shape = weight.shape


class MLXBackend:
    name = "mlx"

    def __init__(self, device: str | None = None, dtype: str | None = None,
                 key_block: int = 256, quantized: bool = True) -> None:
        mx = _mx()
        self.device = device or "cpu"
        if self.device not in ("cpu", "gpu"):
            raise BackendError(f"mlx backend device {self.device!r} is not supported; "
                               "supported: cpu, gpu")
        self.dtype = dtype or "float32"
        self.mx_dtype = {"float32": mx.float32, "bfloat16": mx.bfloat16,
                         "float16": mx.float16}.get(self.dtype)
        if self.mx_dtype is None:
            raise BackendError(f"unsupported dtype {self.dtype!r} for the mlx backend")
        self.key_block = key_block
        self.quantized = quantized
        self.kernels = None
        if self.device == "gpu":
            from exactdraft.kernels import metal

            self.kernels = metal.require_metal()
        mx.set_default_device(mx.gpu if self.device == "gpu" else mx.cpu)

    def __repr__(self) -> str:
        return f"MLXBackend(device={self.device!r}, dtype={self.dtype!r})"

    # -- weights ---------------------------------------------------------------------------

    def matrix(self, weight: Any) -> Any:
        """Dense [N, K] arrays stay dense; GGUF blocks and MLX affine weights stay quantized
        (GGUF q4_0/q4_1/q8_0 map losslessly onto the affine layout) unless quantized=False."""
        if isinstance(weight, QuantizedTensor) and self.quantized:
            weight = affine_from_blocks(weight)
        if isinstance(weight, AffineQuantizedTensor) and self.quantized:
            return QuantizedLinear(weight)
        dense = np.asarray(weight, dtype=np.float32)
        if dense.ndim != 2:
            raise BackendError(f"a weight matrix must be 2-D, got shape {dense.shape}")
        return _mx().array(dense).astype(self.mx_dtype)

    def vector(self, values: np.ndarray) -> Any:
        return _mx().array(np.asarray(values, dtype=np.float32)).astype(self.mx_dtype)

    # -- ops -------------------------------------------------------------------------------

    def embedding(self, table: Any, token_ids: np.ndarray) -> Any:
        return table[_mx().array(np.asarray(token_ids, dtype=np.int32))]

    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        mx = _mx()
        if self.kernels is not None:
            out = self.kernels.linear(x, weight)
        elif isinstance(weight, QuantizedLinear):
            out = mx.quantized_matmul(x, weight.packed, weight.scales, weight.biases,
                                      transpose=True, group_size=weight.group_size,
                                      bits=weight.bits).astype(x.dtype)
        else:
            out = mx.matmul(x, weight.T)
        return out if bias is None else out + bias

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        mx = _mx()
        if self.kernels is not None:
            return self.kernels.rms_norm(x, weight, eps)
        x32 = x.astype(mx.float32)
        variance = mx.mean(x32 * x32, axis=-1, keepdims=True)
        return weight * (x32 / mx.sqrt(variance + eps)).astype(x.dtype)

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        mx = _mx()
        half = x.shape[-1] // 2
        first, second = x[..., :half], x[..., half:]
        cos, sin = cos[:, None, :], sin[:, None, :]
        return mx.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)

    def silu_mul(self, gate_up: Any) -> Any:
        mx = _mx()
        half = gate_up.shape[-1] // 2
        gate, up = gate_up[..., :half], gate_up[..., half:]
        return gate / (1.0 + mx.exp(-gate)) * up

    def kv_buffer(self, num_kv_heads: int, capacity: int, head_dim: int,
                  previous: Any | None = None) -> Any:
        buffer = _mx().zeros((num_kv_heads, capacity, head_dim), dtype=self.mx_dtype)
        if previous is not None:
            buffer[:, : previous.shape[1]] = previous
        return buffer

    def kv_write(self, buffer: Any, start: int, rows: Any) -> Any:
        buffer[:, start:start + rows.shape[0]] = rows.transpose(1, 0, 2)
        return buffer

    def attention(self, q: Any, keys: Any, values: Any, positions: np.ndarray,
                  window: int, scale: float) -> Any:
        if self.kernels is not None:
            return self.kernels.attention(q, keys, values, positions, window, scale)
        mx = _mx()
        rows, num_heads, head_dim = q.shape
        num_kv_heads = keys.shape[0]
        group = num_heads // num_kv_heads
        block = self.key_block
        first = 0
        if window > 0:
            first = max(0, int(positions.min()) - window + 1) // block * block
        end = (int(positions.max()) // block + 1) * block
        if end > keys.shape[1]:
            raise BackendError(f"KV buffer of {keys.shape[1]} positions cannot hold key "
                               f"{int(positions.max())}")
        grouped = q.reshape(rows, num_kv_heads, group, head_dim).transpose(1, 2, 0, 3)
        grouped = grouped.reshape(num_kv_heads, group * rows, head_dim).astype(mx.float32)
        key_span = keys[:, first:end].astype(mx.float32)
        scores = mx.matmul(grouped, key_span.transpose(0, 2, 1)) * scale
        key_positions = np.arange(first, end)[None, :]
        query_positions = np.asarray(positions)[:, None]
        visible = key_positions <= query_positions
        if window > 0:
            visible &= query_positions - key_positions < window
        visible = mx.array(np.tile(visible, (group, 1)))
        scores = mx.where(visible, scores, -mx.inf)
        weights = mx.exp(scores - mx.max(scores, axis=-1, keepdims=True))
        value_span = values[:, first:end].astype(mx.float32)
        total = mx.zeros((num_kv_heads, group * rows, 1))
        out = mx.zeros((num_kv_heads, group * rows, head_dim))
        for start in range(0, end - first, block):
            part = weights[:, :, start:start + block]
            total = total + mx.sum(part, axis=-1, keepdims=True)
            out = out + mx.matmul(part, value_span[:, start:start + block])
        out = (out / total).reshape(num_kv_heads, group, rows, head_dim)
        return out.transpose(2, 0, 1, 3).reshape(rows, num_heads, head_dim).astype(q.dtype)

    def to_host(self, x: Any) -> np.ndarray:
        return np.array(x.astype(_mx().float32))


register_backend("mlx", lambda device=None, dtype=None: MLXBackend(device=device, dtype=dtype))
