"""Row-invariant Metal shaders (csrc/metal/*.metal), run through MLX's `mx.fast.metal_kernel`
on Apple silicon, or through the C++ emulator (exactdraft.kernels.metal_emulator) wherever a C++
compiler exists.

Invariant (INVARIANCE.md): each shader gives a row the same bits whatever the number of rows in
the launch, the row's place in it and what the other rows hold. The launch configuration
(template arguments, threadgroup size) follows from weight shapes, head sizes and dtypes only,
never from the row count, so one compiled variant serves every pass. Both engines compile the
identical body text behind the signature text MLX generates, so what the emulator runs in CI is
what Metal runs on a Mac; the emulator refuses bodies outside csrc/metal/SUBSET.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from exactdraft.kernels.metal_emulator import Emulator

from exactdraft.kernels.metal_source import (  # noqa: F401  (re-exported)
    FLOAT_DTYPES,
    KEY_CHUNK,
    SHADER_IO,
    SOURCE_DIR,
    MetalShaderError,
    ShaderSpec,
    dtype_name,
    load_shader,
    metal_available,
)


class MetalEngine:
    """Runs shader bodies through mx.fast.metal_kernel on the Metal device (math mode "safe")."""

    def __init__(self) -> None:
        if not metal_available():
            raise MetalShaderError("MLX with a Metal device is not available on this machine")
        self._kernels: dict[str, Any] = {}

    def run(self, spec: ShaderSpec, inputs: Sequence[Any], template: Sequence[tuple[str, Any]],
            grid: tuple[int, int, int], threadgroup: tuple[int, int, int],
            output_shapes: Sequence[tuple[int, ...]], output_dtypes: Sequence[str]) -> list[Any]:
        """Launch `spec`; returns mlx arrays."""
        import mlx.core as mx

        key = spec.name + "\0" + spec.header + "\0" + spec.body
        kernel = self._kernels.get(key)
        if kernel is None:
            try:
                kernel = mx.fast.metal_kernel(
                    name=spec.name, input_names=list(spec.input_names),
                    output_names=list(spec.output_names), source=spec.body, header=spec.header,
                    ensure_row_contiguous=True, compile_options={"math_mode": "safe"})
            except TypeError as error:
                raise MetalShaderError(f"this MLX cannot pin the Metal math mode ({error}); "
                                       "upgrade mlx") from error
            self._kernels[key] = kernel
        arrays = [mx.array(v) if isinstance(v, np.ndarray) else v for v in inputs]
        return kernel(inputs=arrays, grid=grid, threadgroup=threadgroup,
                      template=[(n, getattr(mx, v) if isinstance(v, str) else v)
                                for n, v in template],
                      output_shapes=list(output_shapes),
                      output_dtypes=[getattr(mx, d) for d in output_dtypes])


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise MetalShaderError(message)


def _shape_of(value: Any, ndim: int, name: str) -> tuple[int, ...]:
    shape = tuple(int(s) for s in value.shape)
    _check(len(shape) == ndim and 0 not in shape,
           f"{name} must be a non-empty {ndim}-d array, got shape {shape}")
    _check(math.prod(shape) < 2**31, f"{name} has {math.prod(shape)} elements; limit 2**31 - 1")
    return shape


def _dtype_of(value: Any, name: str, allowed: Sequence[str]) -> str:
    dtype = dtype_name(value)
    _check(dtype in allowed, f"{name} has dtype {dtype!r}; expected one of {list(allowed)}")
    return dtype


class MetalShaders:
    """The row-invariant ops on the Metal device (engine "metal"), on the emulator ("emulator"),
    or on Metal when this machine has it ("auto"). Results are mlx arrays on Metal and numpy
    arrays on the emulator; inputs may be either (bfloat16 ones as mlx arrays)."""

    def __init__(self, engine: str = "auto", *, cache_dir: Path | None = None,
                 compiler: str = "c++", reverse_thread_order: bool = False,
                 source_dir: Path | None = None):
        if engine == "auto":
            engine = "metal" if metal_available() else "emulator"
        _check(engine in ("metal", "emulator"),
               f"unknown engine {engine!r}; use 'auto', 'metal' or 'emulator'")
        self.engine: Emulator | MetalEngine
        if engine == "metal":
            self.engine = MetalEngine()
        else:
            from exactdraft.kernels.metal_emulator import Emulator

            emulator_dir = Path(source_dir) / "emu" if source_dir else None
            self.engine = Emulator(cache_dir, compiler, reverse_thread_order, emulator_dir)
        self.engine_name = engine
        self.specs = {name: load_shader(name, source_dir) for name in SHADER_IO}

    def _run(self, name: str, inputs: list[Any], template: list[tuple[str, Any]],
             grid: tuple[int, int, int], threadgroup: int, shape: tuple[int, ...]) -> Any:
        return self.engine.run(self.specs[name], inputs, template, grid, (threadgroup, 1, 1),
                               [shape], ["float32"])[0]

    def matmul(self, x: Any, weight: Any) -> Any:
        """x [M, K] float32 times weight [N, K] (float32, bfloat16 or float16) transposed ->
        [M, N] float32."""
        (m, k), (n, k_weight) = _shape_of(x, 2, "x"), _shape_of(weight, 2, "weight")
        _dtype_of(x, "x", ("float32",))
        weight_dtype = _dtype_of(weight, "weight", FLOAT_DTYPES)
        _check(k_weight == k, f"weight has K={k_weight} but x has K={k}")
        grid = (-(-n // 8) * 64, -(-m // 4), 1)
        return self._run("matmul", [x, weight], [("T", weight_dtype)], grid, 64, (m, n))

    def quantized_matmul(self, x: Any, weight: Any, scales: Any, biases: Any,
                         group_size: int, bits: int) -> Any:
        """x [M, K] float32 times an affine-quantized weight in mx.quantize's layout (weight
        [N, K * bits / 32] uint32, scales and biases [N, K / group_size]) -> [M, N] float32."""
        _check(bits in (4, 8) and group_size in (32, 64), f"bits={bits}, group_size="
               f"{group_size}: supported bits 4 or 8, group_size 32 or 64")
        (m, k), (n, words) = _shape_of(x, 2, "x"), _shape_of(weight, 2, "weight")
        _dtype_of(x, "x", ("float32",))
        _dtype_of(weight, "weight", ("uint32",))
        scale_dtype = _dtype_of(scales, "scales", FLOAT_DTYPES)
        _dtype_of(biases, "biases", (scale_dtype,))
        _check(k % group_size == 0 and words * 32 == k * bits, f"x has K={k}, weight has "
               f"{words} words per row: K must be a multiple of {group_size} and words * 32 / "
               f"{bits}")
        for name, value in (("scales", scales), ("biases", biases)):
            _check(_shape_of(value, 2, name) == (n, k // group_size),
                   f"{name} has shape {tuple(value.shape)}; expected {(n, k // group_size)}")
        grid = (-(-n // 8) * 64, -(-m // 4), 1)
        template = [("S", scale_dtype), ("BITS", bits), ("GROUP", group_size)]
        return self._run("quantized_matmul", [x, weight, scales, biases], template, grid, 64,
                         (m, n))

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        """x [M, K] / sqrt(mean(x * x) + eps) * weight [K], all float32 -> [M, K] float32."""
        m, k = _shape_of(x, 2, "x")
        _dtype_of(x, "x", ("float32",))
        _dtype_of(weight, "weight", ("float32",))
        _check(_shape_of(weight, 1, "weight") == (k,), f"weight must have shape {(k,)}")
        eps_array = np.array([eps], np.float32)
        return self._run("rms_norm", [x, weight, eps_array], [], (256, m, 1), 256, (m, k))

    def softmax(self, x: Any) -> Any:
        """Softmax over the last dimension of x [M, N] float32 -> [M, N] float32."""
        m, n = _shape_of(x, 2, "x")
        _dtype_of(x, "x", ("float32",))
        return self._run("softmax", [x], [], (256, m, 1), 256, (m, n))

    def attention(self, q: Any, keys: Any, values: Any, positions: Any, window: int,
                  scale: float, sinks: Any = None) -> Any:
        """Causal grouped-query attention of q [M, Hq, D] float32 at absolute `positions` [M]
        over key and value buffers [Hkv, capacity, D] (float32, bfloat16 or float16); a query at
        p sees keys j <= p, and p - j < window when window > 0. `sinks` (finite float32 [Hq],
        or None) join each row's softmax denominator, merged before the keys. Returns [M, Hq,
        D] float32."""
        m, query_heads, head_dim = _shape_of(q, 3, "q")
        _dtype_of(q, "q", ("float32",))
        kv_heads, capacity, key_dim = _shape_of(keys, 3, "keys")
        cache_dtype = _dtype_of(keys, "keys", FLOAT_DTYPES)
        _dtype_of(values, "values", (cache_dtype,))
        _check(tuple(values.shape) == tuple(keys.shape),
               f"values shape {tuple(values.shape)} != keys shape {tuple(keys.shape)}")
        _check(key_dim == head_dim and query_heads % kv_heads == 0 and head_dim <= 512,
               f"q [{m}, {query_heads}, {head_dim}] does not fit caches [{kv_heads}, {capacity}, "
               f"{key_dim}] (head dim at most 512)")
        position_array = np.asarray(positions).astype(np.int32, copy=False).reshape(-1)
        _check(position_array.shape == (m,), f"{position_array.size} positions for {m} rows")
        _check(0 <= position_array.min() and position_array.max() < capacity,
               f"positions {position_array.tolist()} outside the cache capacity {capacity}")
        _check(int(window) >= 0, f"window must be >= 0 (0: none), got {window}")
        if sinks is None:
            sink_array = np.full(query_heads, -np.inf, np.float32)
        else:
            sink_array = np.asarray(sinks, np.float32).reshape(-1)
            _check(sink_array.shape == (query_heads,) and bool(np.isfinite(sink_array).all()),
                   f"sinks must be {query_heads} finite logits (one per query head), got "
                   f"{np.asarray(sinks).tolist()}")
        inputs = [q, keys, values, position_array, np.array([int(window)], np.int32),
                  np.array([scale], np.float32), sink_array]
        template = [("T", cache_dtype), ("D", head_dim)]
        return self._run("attention", inputs, template, (query_heads * KEY_CHUNK, m, 1),
                         KEY_CHUNK, (m, query_heads, head_dim))
