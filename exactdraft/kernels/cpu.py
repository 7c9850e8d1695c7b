"""Row-invariant CPU kernels (the C extension exactdraft._cpu_kernels) for numpy and torch arrays.

Invariant (INVARIANCE.md): every kernel gives an output row the same bits whatever the number of
rows in the call, the row's place among them, the other rows' contents and the thread count.
The accumulation order over K of a matmul element depends only on K and the weight format (with
the "dot" layout, each activation row is quantized to int8 blocks on its own and the block sums
are exact integers, so its bits do not even depend on the SIMD level); attention reduces keys
in tiles aligned to absolute positions and reads nothing past the row's own position (a
head's sink logit, where given, starts the row's online softmax before its first tile);
elementwise math runs every element through the same vector code. The SIMD level (amx,
avx512vnni, avx512, avx2, neon or scalar) is chosen once per process; levels may differ from each
other in the last bits, so one process keeps one level unless `set_simd_level` changes it. The
amx level (avx512vnni with the dot layout's matmul on AMX tiles) is offered only where CPUID,
the OS and a load-time self-check against avx512vnni's bits allow it; why it is not offered is
logged once. `amx_emulated` runs the same tile code with the tile instructions computed in C: it
exists for tests, which pin it, and is never chosen by default.

Arrays are used in place, never copied: float32 inputs must be C-contiguous numpy arrays or CPU
torch tensors; outputs are new arrays of the input's kind or the given `out=`.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from exactdraft.errors import BackendError
from exactdraft.kernels.cpu_arrays import address_of, is_torch, output_for
from exactdraft.kernels.cpu_weights import (  # noqa: F401  (re-exported: the public API)
    BLOCK_SIZE,
    DOT_GROUP,
    FORMAT_CODES,
    FORMATS,
    LAYOUT_CODES,
    LAYOUTS,
    WEIGHT_GROUP,
    PackedMatrix,
    pack_matrix,
)

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

_LOG = logging.getLogger(__name__)
# Why the amx level is absent, by what an operator should do about it: a CPU without AMX or a
# build without it is the ordinary case; a refusal on a CPU that has AMX deserves a warning.
_ORDINARY_AMX_ABSENCE = ("this CPU reports no amx_tile/amx_int8", "this build has no amx level")


class CpuKernelsUnavailable(BackendError):
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
    """The active SIMD level: 'amx', 'avx512vnni', 'avx512', 'avx2', 'neon' or 'scalar' (or a
    test level that `set_simd_level` pinned)."""
    return _kernels().simd_level()


def simd_levels() -> tuple[str, ...]:
    """The SIMD levels this CPU can run, best (the default) first."""
    return _kernels().simd_levels()


def emulated_simd_levels() -> tuple[str, ...]:
    """Levels only tests pin (never chosen by default): 'amx_emulated', the amx level's code
    with the tile instructions computed in C, where avx512vnni runs."""
    return _kernels().emulated_simd_levels()


def set_simd_level(level: str) -> None:
    """Make a supported (or test) level active for every later call (used to test each code
    path)."""
    if level not in simd_levels() + emulated_simd_levels():
        raise ValueError(f"SIMD level {level!r} is not supported here; supported: "
                         f"{', '.join(simd_levels() + emulated_simd_levels())}")
    _kernels().set_simd_level(level)


def amx_unavailable_reason() -> str | None:
    """Why the amx level is not offered in this process, or None when it is."""
    return _kernels().amx_unavailable_reason()


def probe_amx(*, refuse_permission: bool = False, assume_cpu_support: bool = False) -> str | None:
    """Decide again whether the amx level is offered, log why not, and return that reason (None
    when it is offered); an active amx level that is refused gives way to the next level.
    `refuse_permission` answers the OS permission request for tile data with a refusal, and
    `assume_cpu_support` skips the CPUID and XCR0 checks so that the refusal is reached on any
    CPU (it needs `refuse_permission`: no tile instruction runs on a CPU without AMX)."""
    if assume_cpu_support and not refuse_permission:
        raise ValueError("assume_cpu_support needs refuse_permission=True: without the refusal "
                         "the probe would go on to run tile instructions")
    reason = _kernels().probe_amx(bool(assume_cpu_support), bool(refuse_permission))
    _log_amx(reason)
    return reason


def _log_amx(reason: str | None) -> None:
    """One log line: the amx level is offered, or why not and which level runs instead."""
    if reason is None:
        _LOG.info("SIMD level amx offered (tile self-check reproduced avx512vnni's bits)")
        return
    ordinary = reason.startswith(_ORDINARY_AMX_ABSENCE)
    _LOG.log(logging.INFO if ordinary else logging.WARNING,
             "SIMD level amx not offered: %s; level %s runs", reason, simd_level())


if _native is not None:
    _log_amx(_native.amx_unavailable_reason())


# -- kernels -----------------------------------------------------------------------------------

def matmul(x: Any, weight: Any, bias: Any = None, out: Any = None) -> Any:
    """x [M, K] float32 times weight [N, K] transposed, plus bias [N] -> float32 [M, N]."""
    kernels = _kernels()
    packed = weight if type(weight) is PackedMatrix else pack_matrix(weight)
    columns, depth = packed.shape
    x_address = address_of(x, "x", "float32", (None, depth))
    rows = x.shape[0]
    bias_address = 0 if bias is None else address_of(bias, "bias", "float32", (columns,))
    out, out_address = output_for(out, x, (rows, columns), (x, bias, packed.data))
    if rows:
        kernels.matmul(x_address, rows, depth, packed.address, columns,
                       FORMAT_CODES[packed.format], packed.layout_code, bias_address,
                       out_address, 0)
    return out


def quantize_rows(x: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The activation quantization of the dot layout's matmul, for x [M, K] (K % 32 == 0):
    per block of 32, d = max |x| / 127 and q = x / d rounded to nearest even, clamped to
    [-127, 127] (q = 0 where d is 0). Returns numpy (q int8 [M, K], d float32 [M, K / 32],
    d * sum(q) float32 [M, K / 32], sum(q) int32 [M, K / 32])."""
    kernels = _kernels()
    x_address = address_of(x, "x", "float32", (None, None))
    rows, depth = x.shape
    if depth % BLOCK_SIZE:
        raise ValueError(f"quantize_rows needs K to be a multiple of {BLOCK_SIZE}, got {depth}")
    blocks = depth // BLOCK_SIZE
    values = np.empty((blocks, rows, BLOCK_SIZE), np.int8)  # block-major, as the kernel keeps it
    scales, scaled_sums = (np.empty((blocks, rows), np.float32) for _ in range(2))
    sums = np.empty((blocks, rows), np.int32)
    if rows:
        kernels.quantize_rows(x_address, rows, depth, values, scales, scaled_sums, sums)
    return (values.transpose(1, 0, 2).reshape(rows, depth), scales.T.copy(), scaled_sums.T.copy(),
            sums.T.copy())


def attention(q: Any, keys: Any, values: Any, positions: Any, window: int, scale: float,
              out: Any = None, tree_paths: Any = None, sinks: Any = None) -> Any:
    """Causal grouped-query attention of q [M, Hq, D] at absolute `positions` [M] over key and
    value buffers [Hkv, capacity, D]: a query at p sees keys j <= p (and p - j < window when
    window > 0). Returns float32 [M, Hq, D]. With `tree_paths` (int32 [M, M]) the rows are a
    token tree: row 0 is its root at positions[0] = base, row r sits at base + its depth d_r,
    and for base + d (d <= d_r) it reads the key in slot base + tree_paths[r, d], the row of its
    ancestor at depth d; keys before base are read from their own slots. With `sinks` (float32
    [Hq]) each head's sink logit joins every row's softmax denominator: the online softmax
    starts from it (csrc/cpu/attention_body.h)."""
    kernels = _kernels()
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"window must be a non-negative integer, got {window!r}")
    q_address = address_of(q, "q", "float32", (None, None, None))
    rows, heads, head_dim = q.shape
    keys_address = address_of(keys, "keys", "float32", (None, None, head_dim))
    kv_heads, capacity = keys.shape[0], keys.shape[1]
    values_address = address_of(values, "values", "float32", (kv_heads, capacity, head_dim))
    if heads % kv_heads:
        raise ValueError(f"q's {heads} heads are not a multiple of the {kv_heads} KV heads")
    if type(positions) is not np.ndarray and is_torch(positions):
        positions = positions.numpy()
    positions = np.ascontiguousarray(positions, dtype=np.int64)
    positions_address = address_of(positions, "positions", "int64", (rows,))
    paths_address, base = 0, 0
    if tree_paths is not None:
        tree_paths = np.ascontiguousarray(tree_paths, dtype=np.int32)
        paths_address = address_of(tree_paths, "tree_paths", "int32", (rows, rows))
        base = int(positions[0]) if rows else 0
    sinks_address = 0
    if sinks is not None:
        sinks_address = address_of(sinks, "sinks", "float32", (heads,))
        if not np.isfinite(np.asarray(sinks)).all():
            raise ValueError("sinks must be finite")
    out, out_address = output_for(out, q, (rows, heads, head_dim), (q, keys, values))
    if rows:
        kernels.attention(q_address, rows, heads, head_dim, keys_address, values_address,
                          kv_heads, capacity, positions_address, int(window), float(scale),
                          out_address, paths_address, base, sinks_address)
    return out


def rms_norm(x: Any, weight: Any, eps: float, out: Any = None) -> Any:
    """x / sqrt(mean(x * x) + eps) * weight over the last dimension of x [M, K]; out may be x."""
    kernels = _kernels()
    x_address = address_of(x, "x", "float32", (None, None))
    rows, width = x.shape
    weight_address = address_of(weight, "weight", "float32", (width,))
    out, out_address = output_for(out, x, (rows, width), (x, weight), in_place_ok=x)
    if rows:
        kernels.rms_norm(x_address, rows, width, weight_address, float(eps), out_address)
    return out


def rope(x: Any, cos: Any, sin: Any, out: Any = None) -> Any:
    """Rotate-half rotary embedding of x [M, H, D] with per-row cos, sin [M, D / 2]:
    out[..., :D/2] = x1 cos - x2 sin, out[..., D/2:] = x2 cos + x1 sin; out may be x."""
    kernels = _kernels()
    x_address = address_of(x, "x", "float32", (None, None, None))
    rows, heads, head_dim = x.shape
    if head_dim % 2:
        raise ValueError(f"rope needs an even head dimension, got {head_dim}")
    cos_address = address_of(cos, "cos", "float32", (rows, head_dim // 2))
    sin_address = address_of(sin, "sin", "float32", (rows, head_dim // 2))
    out, out_address = output_for(out, x, (rows, heads, head_dim), (x, cos, sin), in_place_ok=x)
    if rows:
        kernels.rope(x_address, rows, heads, head_dim, cos_address, sin_address, out_address)
    return out


def silu_mul(gate_up: Any, out: Any = None) -> Any:
    """silu(gate) * up for gate_up [M, 2I] holding gate then up -> float32 [M, I]."""
    return _gated("silu_mul", gate_up, out)


def gelu_mul(gate_up: Any, out: Any = None) -> Any:
    """gelu_tanh(gate) * up for gate_up [M, 2I] holding gate then up -> float32 [M, I]."""
    return _gated("gelu_mul", gate_up, out)


def _gated(kernel: str, gate_up: Any, out: Any) -> Any:
    kernels = _kernels()
    address = address_of(gate_up, "gate_up", "float32", (None, None))
    rows, double_width = gate_up.shape
    if double_width % 2:
        raise ValueError(f"gate_up must have an even width (gate then up), got {double_width}")
    out, out_address = output_for(out, gate_up, (rows, double_width // 2), (gate_up,))
    if rows:
        getattr(kernels, kernel)(address, rows, double_width // 2, out_address)
    return out


def format_table() -> tuple[tuple[int, str, int, int], ...]:
    """The C side's formats: (kernel code, name, weights per block, bytes per block)."""
    return _kernels().format_table()
