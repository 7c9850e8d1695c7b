"""Row-invariant CPU kernels (the C extension exactdraft._cpu_kernels) for numpy and torch arrays.

Invariant (INVARIANCE.md): every kernel gives an output row the same bits whatever the number of
rows in the call, the row's place among them, the other rows' contents and the thread count.
The accumulation order over K of a matmul element depends only on K and the weight format;
attention reduces keys in tiles aligned to absolute positions and reads nothing past the row's
own position; elementwise math runs every element through the same vector code. The SIMD level
(avx512, avx2, neon or scalar) is chosen once per process; levels may differ from each other in
the last bits, so one process keeps one level unless `set_simd_level` changes it.

Arrays are used in place, never copied: float32 inputs must be C-contiguous numpy arrays or CPU
torch tensors; outputs are new arrays of the input's kind or the given `out=`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactdraft.models.weights import BLOCK_BYTES, BLOCK_SIZE, QuantizedTensor

try:
    from exactdraft import _cpu_kernels as _native

    _UNAVAILABLE_REASON: str | None = None
except ImportError as _error:
    _native = None
    _UNAVAILABLE_REASON = (
        f"the C extension exactdraft._cpu_kernels is not built ({_error}); it is compiled when "
        "the package is installed with a C compiler present (gcc or clang): reinstall with "
        "`pip install .` and read the build log's warning if it still fails"
    )

FORMATS = ("f32", "bf16", "q8_0", "q4_0", "q4_1")
FORMAT_CODES = {name: code for code, name in enumerate(FORMATS)}
_FLOAT32 = np.dtype(np.float32)


class CpuKernelsUnavailable(RuntimeError):
    """The C extension is missing; the message says why."""


def available() -> bool:
    """Whether the compiled kernels can run in this process."""
    return _native is not None


def unavailable_reason() -> str | None:
    """Why the kernels cannot run, or None when they can."""
    return _UNAVAILABLE_REASON


def _kernels() -> Any:
    if _native is None:
        raise CpuKernelsUnavailable(_UNAVAILABLE_REASON)
    return _native


def native() -> Any:
    """The extension module itself, for callers that own their arrays (contiguous float32 of
    the right shapes, which the functions below check) and call it with raw data pointers."""
    return _kernels()


def set_num_threads(n: int) -> int:
    """Use n threads (the caller included) for later calls; returns the count now running."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"thread count must be a positive integer, got {n!r}")
    return _kernels().set_num_threads(n)


def num_threads() -> int:
    """Threads that run kernels (default: the CPUs this process may use)."""
    return _kernels().num_threads()


def simd_level() -> str:
    """The active SIMD level: 'avx512', 'avx2', 'neon' or 'scalar'."""
    return _kernels().simd_level()


def simd_levels() -> tuple[str, ...]:
    """The SIMD levels this CPU can run, best (the default) first."""
    return _kernels().simd_levels()


def set_simd_level(level: str) -> None:
    """Make a supported level active for every later call (used to test each code path)."""
    if level not in simd_levels():
        raise ValueError(f"SIMD level {level!r} is not supported here; supported: "
                         f"{', '.join(simd_levels())}")
    _kernels().set_simd_level(level)


# -- array checks ------------------------------------------------------------------------------

def _is_torch(array: Any) -> bool:
    return type(array) is not np.ndarray and hasattr(array, "data_ptr")


_NUMPY_DTYPES = {name: np.dtype(name) for name in ("float32", "uint8", "uint16", "int64")}


def _address(array: Any, name: str, dtype: str, shape: tuple[int | None, ...]) -> Any:
    """What the C module takes as a data pointer: the numpy array itself or a torch address."""
    if type(array) is np.ndarray:
        expected = _NUMPY_DTYPES[dtype]
        if array.dtype is not expected and array.dtype != expected:
            raise TypeError(f"{name} must have dtype {dtype}, got {array.dtype}")
        flags = array.flags
        if not flags.c_contiguous or not flags.aligned:
            raise ValueError(f"{name} must be C-contiguous and aligned")
        found = array.shape
        pointer = array
    elif _is_torch(array):
        torch = sys.modules["torch"]
        if array.dtype is not getattr(torch, dtype):
            raise TypeError(f"{name} must have dtype torch.{dtype}, got {array.dtype}")
        if not array.is_cpu:
            raise ValueError(f"{name} must be on the CPU, got device {array.device}")
        if not array.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        found = tuple(array.shape)
        pointer = array.data_ptr()
    else:
        raise TypeError(f"{name} must be a numpy array or a torch tensor, got "
                        f"{type(array).__name__}")
    matches = len(found) == len(shape)
    if matches:
        for expected_size, size in zip(shape, found):
            if expected_size is not None and expected_size != size:
                matches = False
    if not matches:
        wanted = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
        raise ValueError(f"{name} must have shape {wanted}, got {list(found)}")
    return pointer


def _span(array: Any) -> tuple[int, int]:
    if type(array) is np.ndarray:
        start = array.__array_interface__["data"][0]
        return start, start + array.nbytes
    start = array.data_ptr()
    return start, start + array.numel() * array.element_size()


def _output(out: Any, like: Any, shape: tuple[int, ...], inputs: tuple[Any, ...],
            in_place_ok: Any = None) -> tuple[Any, Any]:
    """A float32 output of `shape` (new, or `out` checked) and its address."""
    if out is None:
        if _is_torch(like):
            out = sys.modules["torch"].empty(shape, dtype=sys.modules["torch"].float32)
        else:
            out = np.empty(shape, dtype=np.float32)
        return out, _address(out, "out", "float32", shape)
    address = _address(out, "out", "float32", shape)
    if type(out) is np.ndarray and not out.flags.writeable:
        raise ValueError("out must be writeable")
    if out is not in_place_ok:
        low, high = _span(out)
        for array in inputs:
            if array is None:
                continue
            other_low, other_high = _span(array)
            if low < other_high and other_low < high:
                raise ValueError("out must not overlap the inputs")
    return out, address


# -- weights -----------------------------------------------------------------------------------

LAYOUTS = ("grouped", "rows")
WEIGHT_GROUP = 4  # rows whose blocks the grouped layout interleaves (WEIGHT_GROUP in kernels.h)
_DENSE_BLOCK_BYTES = {"f32": 4 * BLOCK_SIZE, "bf16": 2 * BLOCK_SIZE}


@dataclass(frozen=True, eq=False)
class PackedMatrix:
    """A weight matrix [N, K] ready for `matmul`, in its stored format.

    layout "rows": `data` is the caller's array used in place: float32 [N, K] (f32), uint16 or
    torch bfloat16 bit patterns [N, K] (bf16), or uint8 GGUF blocks [N, K / 32 * block bytes].
    layout "grouped": `data` is a uint8 array of the same size holding the same blocks (32
    weights each, as stored) with the blocks of every WEIGHT_GROUP consecutive rows interleaved,
    so that the kernel reads one sequential stream; values and arithmetic are unchanged.
    """

    format: str
    shape: tuple[int, int]
    data: Any
    layout: str = "rows"

    @property
    def address(self) -> Any:
        return self.data if type(self.data) is np.ndarray else self.data.data_ptr()


def _row_bytes(format: str, depth: int) -> int:
    if format == "f32":
        return 4 * depth
    if format == "bf16":
        return 2 * depth
    if depth % BLOCK_SIZE:
        raise ValueError(f"{format} weights need K to be a multiple of {BLOCK_SIZE}, got {depth}")
    return depth // BLOCK_SIZE * BLOCK_BYTES[format]


def _as_bytes(data: Any) -> np.ndarray:
    """The rows of a packed array as a uint8 numpy view [N, row bytes] (no copy)."""
    if _is_torch(data):
        torch = sys.modules["torch"]
        if data.dtype is torch.bfloat16:
            data = data.view(torch.int16)
        data = data.numpy()
    return data.view(np.uint8).reshape(data.shape[0], -1)


def _group_rows(rows: np.ndarray, block_bytes: int) -> np.ndarray:
    """A copy of uint8 rows [N, row bytes] in the grouped layout (see PackedMatrix)."""
    count, row_bytes = rows.shape
    blocks = row_bytes // block_bytes
    grouped = np.empty_like(rows)
    full = count // WEIGHT_GROUP * WEIGHT_GROUP
    grouped[:full].reshape(full // WEIGHT_GROUP, blocks, WEIGHT_GROUP, block_bytes)[...] = (
        rows[:full].reshape(full // WEIGHT_GROUP, WEIGHT_GROUP, blocks, block_bytes)
        .transpose(0, 2, 1, 3))
    rest = count - full
    if rest:
        grouped[full:].reshape(blocks, rest, block_bytes)[...] = (
            rows[full:].reshape(rest, blocks, block_bytes).transpose(1, 0, 2))
    return grouped


def pack_matrix(weight: Any, format: str | None = None, depth: int | None = None,
                layout: str = "grouped") -> PackedMatrix:
    """Prepare a weight matrix [N, K] for `matmul`.

    Accepts a QuantizedTensor (its raw blocks), a float32 numpy array or torch tensor (f32), a
    torch bfloat16 tensor or a uint16 numpy array with format="bf16", or raw uint8 GGUF blocks
    [N, row bytes] with format="q8_0"/"q4_0"/"q4_1" and depth=K. Other float numpy dtypes are
    converted to float32. layout="rows" uses the data in place; layout="grouped" (faster when
    weights stream from memory) copies it once into the grouped layout of the same size, and
    falls back to "rows" when K is not a multiple of 32.
    """
    if isinstance(weight, PackedMatrix):
        return weight
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    packed = _pack_rows(weight, format, depth)
    if layout == "rows" or packed.shape[1] % BLOCK_SIZE:
        return packed
    block_bytes = _DENSE_BLOCK_BYTES.get(packed.format) or BLOCK_BYTES[packed.format]
    grouped = _group_rows(_as_bytes(packed.data), block_bytes)
    return PackedMatrix(packed.format, packed.shape, grouped, "grouped")


def _pack_rows(weight: Any, format: str | None, depth: int | None) -> PackedMatrix:
    if format is not None and format not in FORMAT_CODES:
        raise ValueError(f"unknown weight format {format!r}; known: {', '.join(FORMATS)}")
    if isinstance(weight, QuantizedTensor):
        if format not in (None, weight.format):
            raise ValueError(f"format {format!r} does not match the {weight.format} weight")
        rows, depth = weight.shape
        data = np.ascontiguousarray(weight.data)
        _address(data, "weight.data", "uint8", (rows, _row_bytes(weight.format, depth)))
        return PackedMatrix(weight.format, (rows, depth), data)
    if _is_torch(weight):
        torch = sys.modules["torch"]
        dtype_name = {torch.float32: "float32", torch.bfloat16: "bfloat16",
                      torch.uint8: "uint8"}.get(weight.dtype)
        if dtype_name is None:
            raise TypeError(f"weight dtype {weight.dtype} is not supported; use float32, "
                            "bfloat16 or uint8 GGUF blocks")
        array_format = {"float32": "f32", "bfloat16": "bf16"}.get(dtype_name, format)
    elif isinstance(weight, np.ndarray):
        dtype_name = weight.dtype.name
        if weight.dtype.kind == "f" and weight.dtype != _FLOAT32 and format in (None, "f32"):
            weight, dtype_name = np.ascontiguousarray(weight, dtype=np.float32), "float32"
        array_format = {"float32": "f32", "uint16": "bf16"}.get(dtype_name, format)
    else:
        raise TypeError(f"weight must be a QuantizedTensor, numpy array or torch tensor, got "
                        f"{type(weight).__name__}")
    if format is not None and array_format != format:
        raise ValueError(f"a {dtype_name} weight cannot be used as format {format!r}")
    if array_format is None:
        raise ValueError(f"a {dtype_name} weight needs format= one of {', '.join(FORMATS)}")
    if weight.ndim != 2:
        raise ValueError(f"weight must be 2-D [N, K] or [N, row bytes], got shape "
                         f"{list(weight.shape)}")
    rows = int(weight.shape[0])
    if array_format in ("f32", "bf16"):
        depth = int(weight.shape[1])
    elif depth is None:
        raise ValueError(f"raw {array_format} blocks need depth=K")
    width = depth if array_format in ("f32", "bf16") else _row_bytes(array_format, depth)
    _address(weight, "weight", dtype_name, (rows, width))
    return PackedMatrix(array_format, (rows, depth), weight)


# -- kernels -----------------------------------------------------------------------------------

def matmul(x: Any, weight: Any, bias: Any = None, out: Any = None) -> Any:
    """x [M, K] float32 times weight [N, K] transposed, plus bias [N] -> float32 [M, N]."""
    kernels = _kernels()
    packed = weight if type(weight) is PackedMatrix else pack_matrix(weight)
    columns, depth = packed.shape
    x_address = _address(x, "x", "float32", (None, depth))
    rows = x.shape[0]
    bias_address = 0 if bias is None else _address(bias, "bias", "float32", (columns,))
    out, out_address = _output(out, x, (rows, columns), (x, bias, packed.data))
    if rows:
        kernels.matmul(x_address, rows, depth, packed.address, columns,
                       FORMAT_CODES[packed.format], packed.layout == "grouped", bias_address,
                       out_address)
    return out


def attention(q: Any, keys: Any, values: Any, positions: Any, window: int, scale: float,
              out: Any = None) -> Any:
    """Causal grouped-query attention of q [M, Hq, D] at absolute `positions` [M] over key and
    value buffers [Hkv, capacity, D]: a query at p sees keys j <= p (and p - j < window when
    window > 0). Returns float32 [M, Hq, D]."""
    kernels = _kernels()
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"window must be a non-negative integer, got {window!r}")
    q_address = _address(q, "q", "float32", (None, None, None))
    rows, heads, head_dim = q.shape
    keys_address = _address(keys, "keys", "float32", (None, None, head_dim))
    kv_heads, capacity = keys.shape[0], keys.shape[1]
    values_address = _address(values, "values", "float32", (kv_heads, capacity, head_dim))
    if heads % kv_heads:
        raise ValueError(f"q's {heads} heads are not a multiple of the {kv_heads} KV heads")
    if type(positions) is not np.ndarray and _is_torch(positions):
        positions = positions.numpy()
    positions = np.ascontiguousarray(positions, dtype=np.int64)
    positions_address = _address(positions, "positions", "int64", (rows,))
    out, out_address = _output(out, q, (rows, heads, head_dim), (q, keys, values))
    if rows:
        kernels.attention(q_address, rows, heads, head_dim, keys_address, values_address,
                          kv_heads, capacity, positions_address, int(window), float(scale),
                          out_address)
    return out


def rms_norm(x: Any, weight: Any, eps: float, out: Any = None) -> Any:
    """x / sqrt(mean(x * x) + eps) * weight over the last dimension of x [M, K]; out may be x."""
    kernels = _kernels()
    x_address = _address(x, "x", "float32", (None, None))
    rows, width = x.shape
    weight_address = _address(weight, "weight", "float32", (width,))
    out, out_address = _output(out, x, (rows, width), (x, weight), in_place_ok=x)
    if rows:
        kernels.rms_norm(x_address, rows, width, weight_address, float(eps), out_address)
    return out


def rope(x: Any, cos: Any, sin: Any, out: Any = None) -> Any:
    """Rotate-half rotary embedding of x [M, H, D] with per-row cos, sin [M, D / 2]:
    out[..., :D/2] = x1 cos - x2 sin, out[..., D/2:] = x2 cos + x1 sin; out may be x."""
    kernels = _kernels()
    x_address = _address(x, "x", "float32", (None, None, None))
    rows, heads, head_dim = x.shape
    if head_dim % 2:
        raise ValueError(f"rope needs an even head dimension, got {head_dim}")
    cos_address = _address(cos, "cos", "float32", (rows, head_dim // 2))
    sin_address = _address(sin, "sin", "float32", (rows, head_dim // 2))
    out, out_address = _output(out, x, (rows, heads, head_dim), (x, cos, sin), in_place_ok=x)
    if rows:
        kernels.rope(x_address, rows, heads, head_dim, cos_address, sin_address, out_address)
    return out


def silu_mul(gate_up: Any, out: Any = None) -> Any:
    """silu(gate) * up for gate_up [M, 2I] holding gate then up -> float32 [M, I]."""
    kernels = _kernels()
    address = _address(gate_up, "gate_up", "float32", (None, None))
    rows, double_width = gate_up.shape
    if double_width % 2:
        raise ValueError(f"gate_up must have an even width (gate then up), got {double_width}")
    out, out_address = _output(out, gate_up, (rows, double_width // 2), (gate_up,))
    if rows:
        kernels.silu_mul(address, rows, double_width // 2, out_address)
    return out
