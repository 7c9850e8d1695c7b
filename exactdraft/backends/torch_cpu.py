"""The torch backend on device "cpu" with exactdraft's own C kernels (csrc/cpu).

Invariant (INVARIANCE.md): linear, rms_norm, rope, silu_mul and attention run through kernels
that are row invariant by construction (each output element's K order depends on K and the
weight format only; attention reads fixed tiles aligned to absolute positions and nothing past
a row's own position; thread partitions follow the weight shape), so no row ever depends on
the row count, its place in the pass, or the thread count. Weights stay in their stored format:
float32, bfloat16 (dtype="bfloat16"), or GGUF blocks (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k,
q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, mxfp4, tq1_0, tq2_0, q1_0) or a block-scaled FP8
folder's fp8_e4m3 blocks when a checkpoint is loaded with keep_quantized=True (the default);
activations and the KV cache are float32. fp8_e4m3 weights always multiply float32
activations, with the bytes of their float32 values' matmul. Other quantized weights
multiply int8-quantized activation rows with exact integer block sums by default
(quantized_activations=True, as llama.cpp does; each row is quantized on its own, so rows stay
invariant); quantized_activations=False keeps float32 activations for q8_0/q4_0/q4_1 and
dequantizes the other block formats to float32.

With fused_layers=True (the default) the backend declares fused layers: `run_layer` runs a whole
decoder layer in one C call that makes the same kernel calls as the per-op methods, in the same
order, so the two paths give the same bits; its plan is built once per layer at load.

Every tensor these methods hand to a kernel is one this backend made (contiguous float32 of a
known shape), so they call the extension with raw data pointers instead of re-checking each
argument: a decode step makes a few hundred kernel calls, and checking them in Python would
cost more than the arithmetic of a small model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from exactdraft.backends.base import (
    BackendError,
    DecoderLayer,
    LayerShape,
    SequenceLayers,
    SequenceRows,
    dense_matrix,
)
from exactdraft.backends.sinks import sink_logits
from exactdraft.backends.torch_backend import TorchBackend
from exactdraft.formats.table import QuantizedTensor, StackedWeight
from exactdraft.kernels import cpu

ACTIVATION_CODES = {"silu": 0, "gelu_tanh": 1}  # enum layer_activation in decoder_layer.h
# The version of the CPU kernels' arithmetic: every machine, SIMD level and thread count that
# names it gives the same bits for the same weights and inputs.
CPU_ARITHMETIC = "cpu-kernels-1"


class Matrix:
    """Packed weights and what a matmul call needs of them, looked up once: one part, or parts
    of different formats stacked along the output (each part's columns computed on their own,
    so they have the bits of a matmul of that part alone)."""

    def __init__(self, parts: list[cpu.PackedMatrix]) -> None:
        self.packed = parts  # keeps the data alive
        self.columns = sum(part.shape[0] for part in parts)
        self.depth = parts[0].shape[1]
        self.shape = (self.columns, self.depth)
        # (address, first column, columns, format code, layout code) per part
        self.parts = []
        first = 0
        for part in parts:
            data = part.data
            address = data.ctypes.data if isinstance(data, np.ndarray) else data.data_ptr()
            self.parts.append((address, first, part.shape[0], cpu.FORMAT_CODES[part.format],
                               part.layout_code))
            first += part.shape[0]
        self.layout = self.parts[0][4]

    def plan_entry(self, bias: Any | None) -> tuple[tuple[int, int, int, int, int, int], ...]:
        """What the C layer plan takes for this weight and its bias: one tuple per part."""
        base = 0 if bias is None else bias.data_ptr()
        return tuple((address, base and base + 4 * first, columns, self.depth, code, layout)
                     for address, first, columns, code, layout in self.parts)


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
        parts = weight.parts if isinstance(weight, StackedWeight) else [weight]
        return Matrix([self._pack(part) for part in parts])

    def _pack(self, weight: Any) -> cpu.PackedMatrix:
        if isinstance(weight, QuantizedTensor):
            row = weight.row
            if self.quantized_activations and row.integer_dot:
                return cpu.pack_matrix(weight, layout="dot")
            if row.float_kernel:
                return cpu.pack_matrix(weight, layout="grouped")
            # No kernel for this format with these activations: its exact float32 values.
        dense = dense_matrix(weight)
        if self.dtype == "bfloat16":
            return cpu.pack_matrix(self._torch.from_numpy(dense).bfloat16())
        return cpu.pack_matrix(dense)

    def vector(self, values: np.ndarray) -> Any:
        return self._torch.from_numpy(np.array(values, dtype=np.float32))

    def embedding(self, table: Any, token_ids: np.ndarray) -> Any:
        # A numpy gather: torch's indexing may start its OpenMP threads, which then spin on the
        # cores the C kernels' own threads need.
        ids = np.asarray(token_ids, dtype=np.int64)
        return self._torch.from_numpy(table.numpy()[ids])

    def linear(self, x: Any, weight: Matrix, bias: Any | None = None) -> Any:
        x = x.contiguous()
        rows, columns = x.shape[0], weight.columns
        out = self._empty(rows, columns)
        base, bias_base = out.data_ptr(), 0 if bias is None else bias.data_ptr()
        for address, first, part_columns, code, layout in weight.parts:
            self._native.matmul(x.data_ptr(), rows, weight.depth, address, part_columns, code,
                                layout, bias_base and bias_base + 4 * first, base + 4 * first,
                                columns)
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
        # numpy's zeros comes from calloc; torch.zeros fills with its thread pool, which costs
        # milliseconds per buffer when the cores are busy (measured: 8 ms against 5 us).
        buffer = np.zeros((num_kv_heads, capacity, head_dim), np.float32)
        if previous is not None:
            buffer[:, : previous.shape[1]] = previous.numpy()
        return self._torch.from_numpy(buffer)

    tree_attention = True
    attention_sinks = True

    def attention(self, q: Any, keys: Any, values: Any, positions: np.ndarray,
                  window: int, scale: float, tree_paths: np.ndarray | None = None,
                  sinks: np.ndarray | None = None) -> Any:
        kv_heads, capacity, head_dim = keys.shape
        last = int(positions.max())
        if last >= capacity:
            raise BackendError(f"KV buffer of {capacity} positions cannot hold key {last}")
        q = q.contiguous()
        rows, heads = q.shape[0], q.shape[1]
        positions = np.ascontiguousarray(positions, dtype=np.int64)
        out = self._empty(rows, heads, head_dim)
        if tree_paths is not None:
            tree_paths = np.ascontiguousarray(tree_paths, dtype=np.int32)
        if sinks is not None:
            sinks = sink_logits(sinks, heads)
        self._native.attention(q.data_ptr(), rows, heads, head_dim, keys.data_ptr(),
                               values.data_ptr(), kv_heads, capacity, positions, window, scale,
                               out.data_ptr(), 0 if tree_paths is None else tree_paths,
                               int(positions[0]), 0 if sinks is None else sinks)
        return out

    def kv_move(self, buffer: Any, sources: np.ndarray, destinations: np.ndarray) -> Any:
        torch = self._torch
        buffer[:, torch.from_numpy(np.asarray(destinations, dtype=np.int64))] = \
            buffer[:, torch.from_numpy(np.asarray(sources, dtype=np.int64))]
        return buffer

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

    def run_layer(self, plan: Any, hidden: Any, sequences: list[SequenceRows], cos: Any,
                  sin: Any) -> Any:
        """One decoder layer for the rows of `sequences`: writes each one's keys and values
        into its buffers [Hkv, capacity, D] and returns the new hidden [M, H]; bit for bit the
        per-op body (exactdraft.models.layer.Layer.run) on this backend."""
        return self.run_layers([plan], hidden, [
            SequenceLayers([s.keys], [s.values], s.start, s.rows, s.depths, s.tree_paths)
            for s in sequences], [(cos, sin)])

    def run_layers(self, plans: Sequence[Any], hidden: Any, sequences: list[SequenceLayers],
                   tables: Sequence[tuple[Any, Any]]) -> Any:
        """run_layer for every plan in turn, in one C call (the same kernel calls): layer i
        reads the output of layer i - 1 and writes sequence.at(i)'s buffers."""
        hidden = hidden.contiguous()
        out = self._empty(*hidden.shape)
        parts = tuple((tuple(k.data_ptr() for k in s.keys), tuple(v.data_ptr() for v in s.values),
                       s.keys[0].shape[1], s.start, s.rows,
                       0 if s.depths is None else np.ascontiguousarray(s.depths, np.int32),
                       0 if s.tree_paths is None else np.ascontiguousarray(s.tree_paths, np.int32))
                      for s in sequences)
        self._native.decoder_layers(tuple(plans), hidden.data_ptr(), out.data_ptr(), parts,
                                    tuple(cos.data_ptr() for cos, _ in tables),
                                    tuple(sin.data_ptr() for _, sin in tables))
        return out

    def to_host(self, x: Any) -> np.ndarray:
        return x.numpy()
