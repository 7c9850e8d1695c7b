"""The mlx backend: device "cpu" on MLX's own ops, device "gpu" on exactdraft's Metal shaders.

Invariant (INVARIANCE.md): each op gives a row the same bits whatever the number of rows in the
call. On device "cpu" that rests on MLX's CPU build, whose matmul, quantized matmul, reductions
and elementwise ops were measured row invariant (a reference BLAS, no row-count dispatch); the
load-time guard re-checks it on the loaded weights every time, because a new MLX release may
change it. On device "gpu" MLX's own quantized matmul and attention pick kernels by row count,
so linear, rms_norm and attention run through the shaders in csrc/metal instead
(exactdraft.kernels.metal), whose launch configuration follows from shapes and dtypes alone.
`shaders="emulator"` runs those same shader bodies through the C++ emulator on any device, so
the model path of device "gpu" can be exercised where no Metal device exists.

Attention on MLX's own ops reduces keys in fixed blocks aligned to absolute positions, exactly
as the torch backend does; the attention shader uses 64-key chunks aligned the same way. Either
way keys past a row's own position never change its bits. Sinks (backends/sinks.py) start
each row's softmax on both paths, before its keys.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from exactdraft.backends.base import (
    BackendError,
    WithoutFusedLayers,
    WithoutTreeAttention,
    dense_matrix,
)
from exactdraft.backends.sinks import sink_logits
from exactdraft.formats.table import AffineQuantizedTensor, QuantizedTensor, affine_from_blocks

if TYPE_CHECKING:
    from exactdraft.kernels.metal import MetalShaders

# MLX releases whose CPU ops (and, on Apple Silicon, whose metal_kernel interface) this backend
# was checked against. Others still run, but only after the load-time guard passes.
CHECKED_MLX_VERSIONS = ("0.32.4",)
SHADER_ENGINES = ("metal", "emulator")
SHADER_GROUP_SIZES = (32, 64)  # the affine group sizes the quantized matmul shader takes
MLX_KEY_BLOCK = 256  # key block of attention on MLX's own ops


def _mx():
    import mlx.core as mx

    return mx


def warn_if_unchecked_mlx() -> None:
    """Warn when the installed MLX is not one of CHECKED_MLX_VERSIONS: its Metal interface and
    elementwise kernels were not checked here, so only the load-time guard vouches for it."""
    version = str(_mx().__version__)
    if version not in CHECKED_MLX_VERSIONS:
        warnings.warn(f"MLX {version} was not checked with exactdraft's Metal path (checked: "
                      f"{', '.join(CHECKED_MLX_VERSIONS)}); the load-time row-invariance guard "
                      "will decide whether drafting stays on (it runs whenever a drafter is set)",
                      RuntimeWarning, stacklevel=3)


def split_groups(weight: AffineQuantizedTensor, group_size: int) -> AffineQuantizedTensor:
    """The same matrix with every group cut into groups of `group_size` that share its scale
    and bias: the weight values are unchanged, only the layout the shader reads."""
    if weight.group_size % group_size:
        raise BackendError(f"affine group size {weight.group_size} is not a multiple of "
                           f"{group_size}")
    repeat = weight.group_size // group_size
    return AffineQuantizedTensor(weight.packed, np.repeat(weight.scales, repeat, axis=1),
                                 np.repeat(weight.biases, repeat, axis=1), group_size,
                                 weight.bits)


class QuantizedLinear:
    """An affine-quantized weight as MLX arrays."""

    def __init__(self, weight: AffineQuantizedTensor) -> None:
        mx = _mx()
        self.packed = mx.array(weight.packed)
        self.scales = mx.array(weight.scales)
        self.biases = mx.array(weight.biases)
        self.group_size, self.bits = weight.group_size, weight.bits
        self.shape = weight.shape


class MLXBackend(WithoutFusedLayers, WithoutTreeAttention):
    """Row-invariant ops on MLX arrays. `shaders`: None for MLX's own ops on device "cpu" and
    the Metal shaders on device "gpu"; "metal" or "emulator" to pick the shader engine (or a
    ready exactdraft.kernels.metal.MetalShaders, e.g. one with its own emulator cache)."""

    name = "mlx"

    def __init__(self, device: str | None = None, dtype: str | None = None,
                 key_block: int | None = None, quantized: bool = True,
                 shaders: str | MetalShaders | None = None) -> None:
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
        if self.device == "gpu":
            warn_if_unchecked_mlx()
            if not mx.metal.is_available():
                raise BackendError("mlx backend device 'gpu' needs MLX with a Metal device, "
                                   "which this machine lacks (mx.metal.is_available() is False)")
        self.shaders = self._shader_engine(shaders)
        self.key_block = self._key_block(key_block)
        self.quantized = quantized
        engine = "mlx-ops" if self.shaders is None else f"shaders-{self.shaders.engine_name}"
        self.arithmetic = f"mlx-{mx.__version__}-{self.device}-{engine}-{self.dtype}"
        mx.set_default_device(mx.gpu if self.device == "gpu" else mx.cpu)

    def _shader_engine(self, shaders: str | MetalShaders | None) -> MetalShaders | None:
        """The MetalShaders that run linear, rms_norm and attention, or None for MLX's ops."""
        from exactdraft.kernels.metal import MetalShaderError, MetalShaders

        if shaders is None:
            shaders = "metal" if self.device == "gpu" else None
        name = shaders.engine_name if isinstance(shaders, MetalShaders) else shaders
        if name == "metal" and self.device != "gpu":
            raise BackendError("the 'metal' shaders run on device 'gpu' only; use "
                               f"shaders='emulator' on device {self.device!r}")
        if shaders is None or isinstance(shaders, MetalShaders):
            engine = shaders
        elif shaders in SHADER_ENGINES:
            try:
                engine = MetalShaders(shaders)
            except MetalShaderError as error:
                raise BackendError(f"the mlx backend cannot use the {shaders!r} shaders: "
                                   f"{error}") from error
        else:
            raise BackendError(f"unknown shaders {shaders!r}; use None, "
                               f"{' or '.join(map(repr, SHADER_ENGINES))}")
        return engine

    def _key_block(self, key_block: int | None) -> int:
        """The KV capacity unit: with shaders, the attention shader's chunk (so the guard's probe
        crosses a chunk boundary), or a multiple of it; otherwise MLX attention's key block."""
        from exactdraft.kernels.metal import KEY_CHUNK

        if key_block is None:
            return KEY_CHUNK if self.shaders is not None else MLX_KEY_BLOCK
        if isinstance(key_block, bool) or not isinstance(key_block, int) or key_block < 1:
            raise BackendError(f"key_block must be a positive integer, got {key_block!r}")
        if self.shaders is not None and key_block % KEY_CHUNK:
            raise BackendError(f"key_block {key_block} is not a multiple of the attention "
                               f"shader's {KEY_CHUNK}-key chunk")
        return key_block

    def __repr__(self) -> str:
        engine = "None" if self.shaders is None else repr(self.shaders.engine_name)
        return f"MLXBackend(device={self.device!r}, dtype={self.dtype!r}, shaders={engine})"

    def _from_shader(self, result: Any, dtype: Any) -> Any:
        """A shader's float32 result (numpy from the emulator, mlx from Metal) as an mx array
        in `dtype`."""
        mx = _mx()
        out = mx.array(result) if isinstance(result, np.ndarray) else result
        return out if dtype == mx.float32 else out.astype(dtype)

    # -- weights ---------------------------------------------------------------------------

    def matrix(self, weight: Any) -> Any:
        """Dense [N, K] arrays stay dense; GGUF blocks and MLX affine weights stay quantized
        (GGUF q4_0/q4_1/q8_0 map losslessly onto the affine layout) unless quantized=False."""
        if isinstance(weight, QuantizedTensor) and self.quantized \
                and weight.row.affine_bits is not None:
            weight = affine_from_blocks(weight)
        if isinstance(weight, AffineQuantizedTensor) and self.quantized:
            if self.shaders is not None and weight.group_size not in SHADER_GROUP_SIZES:
                weight = split_groups(weight, SHADER_GROUP_SIZES[-1])
            return QuantizedLinear(weight)
        dense = dense_matrix(weight)
        return _mx().array(dense).astype(self.mx_dtype)

    def vector(self, values: np.ndarray) -> Any:
        return _mx().array(np.asarray(values, dtype=np.float32)).astype(self.mx_dtype)

    # -- ops -------------------------------------------------------------------------------

    def embedding(self, table: Any, token_ids: np.ndarray) -> Any:
        return table[_mx().array(np.asarray(token_ids, dtype=np.int32))]

    def linear(self, x: Any, weight: Any, bias: Any | None = None) -> Any:
        mx = _mx()
        if self.shaders is not None:
            x32 = x.astype(mx.float32)
            if isinstance(weight, QuantizedLinear):
                out = self.shaders.quantized_matmul(x32, weight.packed, weight.scales,
                                                    weight.biases, weight.group_size, weight.bits)
            else:
                out = self.shaders.matmul(x32, weight)
            out = self._from_shader(out, x.dtype)
        elif isinstance(weight, QuantizedLinear):
            out = mx.quantized_matmul(x, weight.packed, weight.scales, weight.biases,
                                      transpose=True, group_size=weight.group_size,
                                      bits=weight.bits).astype(x.dtype)
        else:
            out = mx.matmul(x, weight.T)
        return out if bias is None else out + bias

    def rms_norm(self, x: Any, weight: Any, eps: float) -> Any:
        mx = _mx()
        if self.shaders is not None:
            # The shader normalises rows of a matrix; leading dims (heads, for qk-norm) are rows.
            rows = x.reshape(-1, x.shape[-1]).astype(mx.float32)
            out = self.shaders.rms_norm(rows, weight.astype(mx.float32), eps)
            return self._from_shader(out, x.dtype).reshape(x.shape)
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

    def gelu_mul(self, gate_up: Any) -> Any:
        mx = _mx()
        half = gate_up.shape[-1] // 2
        gate, up = gate_up[..., :half], gate_up[..., half:]
        # 0.5 x (1 + tanh(u)) == x sigmoid(2 u), u = sqrt(2 / pi) (x + 0.044715 x^3).
        inner = gate * 1.5957691216057308 * (1.0 + 0.044715 * gate * gate)
        return gate / (1.0 + mx.exp(-inner)) * up

    def kv_buffer(self, num_kv_heads: int, capacity: int, head_dim: int,
                  previous: Any | None = None) -> Any:
        buffer = _mx().zeros((num_kv_heads, capacity, head_dim), dtype=self.mx_dtype)
        if previous is not None:
            buffer[:, : previous.shape[1]] = previous
        return buffer

    def kv_write(self, buffer: Any, start: int, rows: Any) -> Any:
        buffer[:, start:start + rows.shape[0]] = rows.transpose(1, 0, 2)
        return buffer

    attention_sinks = True

    def attention(self, q: Any, keys: Any, values: Any, positions: np.ndarray,
                  window: int, scale: float, sinks: np.ndarray | None = None) -> Any:
        mx = _mx()
        if sinks is not None:
            sinks = sink_logits(sinks, q.shape[1])
        if self.shaders is not None:
            out = self.shaders.attention(q.astype(mx.float32), keys, values,
                                         np.asarray(positions), int(window), scale, sinks)
            return self._from_shader(out, q.dtype)
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
        top = mx.max(scores, axis=-1, keepdims=True)
        total = mx.zeros((num_kv_heads, group * rows, 1))
        if sinks is not None:
            # [Hkv, group * rows, 1] in the rows' (group member, query row) order.
            sink = np.repeat(sinks.reshape(num_kv_heads, group, 1), rows, axis=2).reshape(
                num_kv_heads, group * rows, 1)
            top = mx.maximum(top, mx.array(sink))
            total = mx.exp(mx.array(sink) - top)
        weights = mx.exp(scores - top)
        value_span = values[:, first:end].astype(mx.float32)
        out = mx.zeros((num_kv_heads, group * rows, head_dim))
        for start in range(0, end - first, block):
            part = weights[:, :, start:start + block]
            total = total + mx.sum(part, axis=-1, keepdims=True)
            out = out + mx.matmul(part, value_span[:, start:start + block])
        out = (out / total).reshape(num_kv_heads, group, rows, head_dim)
        return out.transpose(2, 0, 1, 3).reshape(rows, num_heads, head_dim).astype(q.dtype)

    def concatenate(self, parts: list[Any]) -> Any:
        return _mx().concatenate(parts)

    def to_host(self, x: Any) -> np.ndarray:
        return np.array(x.astype(_mx().float32))

