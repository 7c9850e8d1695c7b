"""The padded torch backend on device "cpu": torch's own ops, used where they keep rows invariant.

This is the fallback when exactdraft's C kernels (backends/torch_cpu.py) are not built, and the
reference the C path is compared with.

Invariant (INVARIANCE.md): each op gives a row the same bits whatever the number of rows in the
call and wherever the row sits. On this path that rests on three measured facts, which the
load-time guard and the per-op tests re-check on every machine rather than trust:
- MKL's `x @ W` (and batched `@`) gives a row the same bits for every row count that is a
  multiple of 4, so every matmul pads its rows up to a multiple of 4 and makes one call;
- correctly rounded elementwise ops (+, *, /, sqrt) and torch's exp are position independent,
  while torch's vectorised sigmoid and silu are not (an element's bits depend on where it sits
  in the tensor), so silu is written as x / (1 + exp(-x));
- reductions over a contiguous last dimension of fixed length are row independent.
Attention scores all keys with one padded matmul, subtracts the row's exact maximum, and then
adds fixed blocks of `key_block` keys, aligned to absolute positions, in block order; a row's
masked keys contribute exact zeros, so keys beyond its own position never change its bits.
With sinks (backends/sinks.py) the maximum includes the head's sink and the sum of weights
starts from exp(sink - max), before the first block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft.backends.base import (
    BackendError,
    WithoutFusedLayers,
    WithoutTreeAttention,
    dense_matrix,
)
from exactdraft.backends.sinks import sink_logits

_TORCH_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
ROW_MULTIPLE = 4
GELU_SCALE = 0.7978845608028654  # sqrt(2 / pi)


def _torch():
    import torch

    return torch


class TorchBackend(WithoutFusedLayers, WithoutTreeAttention):
    """Row-invariant ops on torch tensors (device cpu)."""

    name = "torch"

    default_device = "cpu"
    default_dtype = "float32"

    def __init__(self, device: str | None = None, dtype: str | None = None,
                 key_block: int = 256) -> None:
        torch = _torch()
        self.device = device or self.default_device
        self.dtype = dtype or self.default_dtype
        if self.dtype not in _TORCH_DTYPES:
            raise BackendError(f"unsupported dtype {self.dtype!r} for the {self!r} backend; "
                               f"supported: {', '.join(_TORCH_DTYPES)}")
        self.torch_dtype = getattr(torch, _TORCH_DTYPES[self.dtype])
        self.torch_device = self.checked_device(torch)
        self.key_block = key_block
        # MKL's bits for a padded row count, re-checked by the guard on every machine.
        self.arithmetic = f"torch-padded-cpu-{torch.__version__}-{self.dtype}"

    def checked_device(self, torch: Any) -> Any:
        """The torch device for self.device, or a BackendError saying which are supported."""
        if self.device != "cpu":
            raise BackendError(
                f"torch backend device {self.device!r} is not supported yet; supported: cpu"
            )
        return torch.device("cpu")

    def __repr__(self) -> str:
        return f"TorchBackend(device={self.device!r}, dtype={self.dtype!r})"

    # -- weights ---------------------------------------------------------------------------

    def matrix(self, weight: Any) -> Any:
        torch = _torch()
        dense = dense_matrix(weight)
        # Stored as [K, N] so that every call is the measured `x @ W` form.
        return torch.from_numpy(dense).to(self.torch_dtype).t().contiguous()

    def vector(self, values: np.ndarray) -> Any:
        host = _torch().from_numpy(np.array(values, dtype=np.float32))
        return host.to(self.torch_device, self.torch_dtype)

    # -- ops -------------------------------------------------------------------------------

    def embedding(self, table: Any, token_ids: np.ndarray) -> Any:
        ids = _torch().from_numpy(np.asarray(token_ids, dtype=np.int64))
        return table[ids.to(self.torch_device)]

    def _padded_matmul(self, a: Any, b: Any) -> Any:
        """a @ b computed as ROW_MULTIPLE-row products (a's rows zero-padded), one batch of
        them: a GEMM over more rows may block K differently (seen with MKL at 32 rows and
        K = 1536 on an AVX-512 CPU), and a row's bits would follow the row count."""
        torch = _torch()
        rows = a.shape[-2]
        padded = -(-rows // ROW_MULTIPLE) * ROW_MULTIPLE
        if padded != rows:
            pad = a.new_zeros(*a.shape[:-2], padded - rows, a.shape[-1])
            a = torch.cat([a, pad], dim=-2)
        blocks = a.reshape(*a.shape[:-2], padded // ROW_MULTIPLE, ROW_MULTIPLE, a.shape[-1])
        out = torch.matmul(blocks, b.unsqueeze(-3))  # [..., blocks, ROW_MULTIPLE, N]
        return out.reshape(*out.shape[:-3], padded, out.shape[-1])[..., :rows, :]

    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        out = self._padded_matmul(x, weight)
        return out if bias is None else out + bias

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        torch = _torch()
        x32 = x.float()
        variance = (x32 * x32).mean(-1, keepdim=True)
        normed = x32 / torch.sqrt(variance + eps)
        return weight * normed.to(x.dtype)

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        first, second = x[..., :half], x[..., half:]
        cos, sin = cos[:, None, :], sin[:, None, :]
        return _torch().cat([first * cos - second * sin, second * cos + first * sin], dim=-1)

    def silu_mul(self, gate_up: Any) -> Any:
        torch = _torch()
        half = gate_up.shape[-1] // 2
        gate, up = gate_up[..., :half], gate_up[..., half:]
        return gate / (1.0 + torch.exp(-gate)) * up

    def gelu_mul(self, gate_up: Any) -> Any:
        torch = _torch()
        half = gate_up.shape[-1] // 2
        gate, up = gate_up[..., :half], gate_up[..., half:]
        # 0.5 x (1 + tanh(u)) == x sigmoid(2 u), written with exp (see silu_mul).
        inner = gate * (GELU_SCALE * 2.0) * (1.0 + 0.044715 * gate * gate)
        return gate / (1.0 + torch.exp(-inner)) * up

    def kv_buffer(self, num_kv_heads: int, capacity: int, head_dim: int,
                  previous: Any | None = None) -> Any:
        buffer = _torch().zeros(num_kv_heads, capacity, head_dim, dtype=self.torch_dtype,
                                device=self.torch_device)
        if previous is not None:
            buffer[:, : previous.shape[1]] = previous
        return buffer

    def kv_write(self, buffer: Any, start: int, rows: Any) -> Any:
        buffer[:, start:start + rows.shape[0]] = rows.transpose(0, 1)
        return buffer

    attention_sinks = True

    def attention(self, q: Any, keys: Any, values: Any, positions: np.ndarray,
                  window: int, scale: float, sinks: np.ndarray | None = None) -> Any:
        torch = _torch()
        rows, num_heads, head_dim = q.shape
        num_kv_heads = keys.shape[0]
        group = num_heads // num_kv_heads
        block = self.key_block
        last = int(positions.max())
        first = 0
        if window > 0:
            first = max(0, int(positions.min()) - window + 1) // block * block
        end = (last // block + 1) * block
        if end > keys.shape[1]:
            raise BackendError(f"KV buffer of {keys.shape[1]} positions cannot hold key {last}")
        # Rows ordered (group member, query row) inside each KV head.
        grouped = q.reshape(rows, num_kv_heads, group, head_dim).permute(1, 2, 0, 3)
        grouped = grouped.reshape(num_kv_heads, group * rows, head_dim).float()
        key_span = keys[:, first:end].float()
        scores = self._padded_matmul(grouped, key_span.transpose(1, 2)) * scale
        key_positions = torch.arange(first, end)
        query_positions = torch.from_numpy(np.asarray(positions, dtype=np.int64))[:, None]
        visible = key_positions[None, :] <= query_positions
        if window > 0:
            visible &= query_positions - key_positions[None, :] < window
        visible = visible.repeat(group, 1)
        scores = scores.masked_fill(~visible, float("-inf"))
        top = scores.amax(-1, keepdim=True)
        total = top.new_zeros(num_kv_heads, group * rows, 1)
        if sinks is not None:
            # [Hkv, group * rows, 1] in the rows' (group member, query row) order.
            sink = torch.tensor(sink_logits(sinks, num_heads), device=top.device)
            sink = sink.reshape(num_kv_heads, group, 1, 1).expand(
                num_kv_heads, group, rows, 1).reshape(num_kv_heads, group * rows, 1)
            top = torch.maximum(top, sink)
            total = torch.exp(sink - top)
        weights = torch.exp(scores - top)
        value_span = values[:, first:end].float()
        out = weights.new_zeros(num_kv_heads, group * rows, head_dim)
        for start in range(0, end - first, block):
            part = weights[:, :, start:start + block]
            total = total + part.sum(-1, keepdim=True)
            out = out + self._padded_matmul(part, value_span[:, start:start + block])
        out = (out / total).reshape(num_kv_heads, group, rows, head_dim)
        return out.permute(2, 0, 1, 3).reshape(rows, num_heads, head_dim).to(q.dtype)

    def concatenate(self, parts: list[Any]) -> Any:
        return _torch().cat(parts)

    def to_host(self, x: Any) -> np.ndarray:
        return x.detach().float().cpu().numpy()
