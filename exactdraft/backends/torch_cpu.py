"""The torch backend on device "cpu" with exactdraft's own C kernels (csrc/cpu).

Invariant (INVARIANCE.md): linear, rms_norm, rope, silu_mul and attention run through kernels
that are row invariant by construction (each output element's K order depends on K and the
weight format only; attention reads fixed tiles aligned to absolute positions and nothing past
a row's own position; thread partitions follow the weight shape), so no row ever depends on
the row count, its place in the pass, or the thread count. Weights stay in their stored format:
float32, bfloat16 (dtype="bfloat16"), or GGUF q8_0/q4_0/q4_1 blocks when a checkpoint is
loaded with keep_quantized=True; activations and the KV cache are float32. Quantized weights
multiply int8-quantized activation rows with exact integer block sums by default
(quantized_activations=True, as llama.cpp does; each row is quantized on its own, so rows stay
invariant); quantized_activations=False keeps float32 activations.

With fused_layers=True (the default) the backend declares fused layers: `run_layer` runs a whole
decoder layer in one C call that makes the same kernel calls as the per-op methods, in the same
order, so the two paths give the same bits; its plan is built once per layer at load.

Every tensor these methods hand to a kernel is one this backend made (contiguous float32 of a
known shape), so they call the extension with raw data pointers instead of re-checking each
argument: a decode step makes a few hundred kernel calls, and checking them in Python would
cost more than the arithmetic of a small model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactdraft.backends.base import BackendError, DecoderLayer, LayerShape, dense_matrix
from exactdraft.backends.torch_backend import TorchBackend
from exactdraft.formats import QuantizedTensor
from exactdraft.kernels import cpu

ACTIVATION_CODES = {"silu": 0, "gelu_tanh": 1}  # enum layer_activation in decoder_layer.h
# The version of the CPU kernels' arithmetic: every machine, SIMD level and thread count that
# names it gives the same bits for the same weights and inputs.
CPU_ARITHMETIC = "cpu-kernels-1"


class Matrix:
    """A packed weight and what a matmul call needs of it, looked up once."""

    def __init__(self, packed: cpu.PackedMatrix) -> None:
        self.packed = packed  # keeps the data alive
        self.columns, self.depth = packed.shape
        self.shape = packed.shape
        data = packed.data
        self.address = data.ctypes.data if isinstance(data, np.ndarray) else data.data_ptr()
        self.format = cpu.FORMAT_CODES[packed.format]
        self.layout = packed.layout_code

    def plan_entry(self, bias: Any | None) -> tuple[int, int, int, int, int, int]:
        """What the C layer plan takes for this weight and its bias."""
        return (self.address, 0 if bias is None else bias.data_ptr(), self.columns, self.depth,
                self.format, self.layout)


class TorchCPUBackend(TorchBackend):
    """Torch tensors on the CPU, computed by the C kernels."""

    name = "torch"

    def __init__(self, device: str | None = None, dtype: str | None = None,
                 key_block: int = 256, quantized_activations: bool = True,
                 fused_layers: bool = True) -> None:
        if not cpu.available():
            raise BackendError(f"the C kernels are unavailable: {cpu.unavailable_reason()}")
        if (dtype or "float32") not in ("float32", "bfloat16"):
            raise BackendError(f"the C kernels keep weights in float32 or bfloat16, not {dtype!r}")
        for name, flag in (("quantized_activations", quantized_activations),
                           ("fused_layers", fused_layers)):
            if not isinstance(flag, bool):
                raise BackendError(f"{name} must be True or False, got {flag!r}")
        super().__init__(device=device, dtype=dtype, key_block=key_block)
        import torch

        self._torch = torch
        self._native = cpu.native()
        self.quantized_activations = quantized_activations
        self.fused_layers = fused_layers
        activations = "int8" if quantized_activations else "float32"
        self.arithmetic = f"{CPU_ARITHMETIC}-{self.dtype}-{activations}-activations"

    def __repr__(self) -> str:
        return (f"TorchCPUBackend(dtype={self.dtype!r}, simd={cpu.simd_level()!r}, "
                f"quantized_activations={self.quantized_activations}, "
                f"fused_layers={self.fused_layers})")

    def _empty(self, *shape: int) -> Any:
        return self._torch.empty(shape, dtype=self._torch.float32)

    def matrix(self, weight: Any) -> Matrix:
        if isinstance(weight, QuantizedTensor):
            layout = "dot" if self.quantized_activations else "grouped"
            return Matrix(cpu.pack_matrix(weight, layout=layout))
        dense = dense_matrix(weight)
        if self.dtype == "bfloat16":
            return Matrix(cpu.pack_matrix(self._torch.from_numpy(dense).bfloat16()))
        return Matrix(cpu.pack_matrix(dense))

    def vector(self, values: np.ndarray) -> Any:
        return self._torch.from_numpy(np.array(values, dtype=np.float32))

    def embedding(self, table: Any, token_ids: np.ndarray) -> Any:
        # A numpy gather: torch's indexing may start its OpenMP threads, which then spin on the
        # cores the C kernels' own threads need.
        ids = np.asarray(token_ids, dtype=np.int64)
        return self._torch.from_numpy(table.numpy()[ids])

    def linear(self, x: Any, weight: Matrix, bias: Any | None = None) -> Any:
        x = x.contiguous()
        rows = x.shape[0]
        out = self._empty(rows, weight.columns)
        self._native.matmul(x.data_ptr(), rows, weight.depth, weight.address, weight.columns,
                            weight.format, weight.layout,
                            0 if bias is None else bias.data_ptr(), out.data_ptr())
        return out

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        x = x.contiguous()
        width = x.shape[-1]
        out = self._empty(*x.shape)
        self._native.rms_norm(x.data_ptr(), x.numel() // width, width, weight.data_ptr(), eps,
                              out.data_ptr())
        return out

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        rows, heads, head_dim = x.shape
        if x.is_contiguous():
            source, out = x, self._empty(rows, heads, head_dim)
        else:
            source = out = x.contiguous()  # a fresh copy, rotated in place
        self._native.rope(source.data_ptr(), rows, heads, head_dim, cos.data_ptr(),
                          sin.data_ptr(), out.data_ptr())
        return out

    def silu_mul(self, gate_up: Any) -> Any:
        rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        out = self._empty(rows, width)
        self._native.silu_mul(gate_up.data_ptr(), rows, width, out.data_ptr())
        return out

    def gelu_mul(self, gate_up: Any) -> Any:
        rows, width = gate_up.shape[0], gate_up.shape[1] // 2
        out = self._empty(rows, width)
        self._native.gelu_mul(gate_up.data_ptr(), rows, width, out.data_ptr())
        return out

    def kv_buffer(self, num_kv_heads: int, capacity: int, head_dim: int,
                  previous: Any | None = None) -> Any:
        buffer = self._torch.zeros(num_kv_heads, capacity, head_dim)
        if previous is not None:
            buffer[:, : previous.shape[1]] = previous
        return buffer

    def attention(self, q: Any, keys: Any, values: Any, positions: np.ndarray,
                  window: int, scale: float) -> Any:
        kv_heads, capacity, head_dim = keys.shape
        last = int(positions.max())
        if last >= capacity:
            raise BackendError(f"KV buffer of {capacity} positions cannot hold key {last}")
        q = q.contiguous()
        rows, heads = q.shape[0], q.shape[1]
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        out = self._empty(rows, heads, head_dim)
        self._native.attention(q.data_ptr(), rows, heads, head_dim, keys.data_ptr(),
                               values.data_ptr(), kv_heads, capacity, positions, window, scale,
                               out.data_ptr())
        return out

    def plan_layer(self, layer: DecoderLayer, shape: LayerShape) -> Any:
        if not self.fused_layers:
            raise BackendError(f"{self!r} was made with fused_layers=False")

        def address(vector: Any | None) -> int:
            return 0 if vector is None else vector.data_ptr()

        s = shape
        return self._native.layer_plan(
            s.hidden_size, s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size,
            s.window, s.eps, s.attention_scale, address(layer.attention_norm),
            address(layer.mlp_norm), address(layer.q_norm), address(layer.k_norm),
            layer.qkv.plan_entry(layer.qkv_bias), layer.output.plan_entry(layer.output_bias),
            layer.gate_up.plan_entry(layer.gate_up_bias), layer.down.plan_entry(layer.down_bias),
            address(layer.post_attention_norm), address(layer.post_mlp_norm),
            ACTIVATION_CODES[s.activation])

    def run_layer(self, plan: Any, hidden: Any, keys: Any, values: Any, start: int, cos: Any,
                  sin: Any) -> Any:
        """One decoder layer for rows at positions start..: writes the rows' keys and values
        into the buffers [Hkv, capacity, D] and returns the new hidden [M, H]; bit for bit the
        per-op body (exactdraft.models.blocks.decoder_layer) on this backend."""
        hidden = hidden.contiguous()
        rows = hidden.shape[0]
        out = self._empty(rows, hidden.shape[1])
        self._native.decoder_layer(plan, hidden.data_ptr(), out.data_ptr(), rows,
                                   keys.data_ptr(), values.data_ptr(), keys.shape[1], start,
                                   cos.data_ptr(), sin.data_ptr())
        return out

    def to_host(self, x: Any) -> np.ndarray:
        return x.numpy()
