"""The array-backend protocol the transformer is written against, and the backend registry.

Invariant (INVARIANCE.md): every op here is row invariant. For a pass of M rows, row r's output
bits equal the bits that row gets when it is computed alone, whatever the other rows hold and
wherever r sits in the pass. For attention a row is one query position; its result depends only
on the keys up to its own position (inside its sliding window), never on how many keys the cache
holds beyond it or how many other queries share the pass.

Backend arrays support `.shape`, `.reshape(...)`, row slicing `x[a:b]` and `+`; everything that
computes goes through the methods below so that a backend can keep the contract with kernels of
its own.
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

Array = Any

DTYPES = ("float32", "bfloat16", "float16")


class BackendError(RuntimeError):
    """A backend cannot be created or cannot run an op; the message says which and why."""


@runtime_checkable
class Backend(Protocol):
    """The ops a decoder-only transformer needs, each row invariant."""

    name: str
    device: str
    dtype: str
    # Keys are reduced in blocks of this many absolute positions; KV buffers are allocated in
    # multiples of it so that a row's last, partial block can always be read at full width.
    key_block: int

    def matrix(self, weight: Any) -> Array:
        """Prepare a weight matrix [N, K] (a float32 numpy array or a quantized weight)."""

    def vector(self, values: np.ndarray) -> Array:
        """Upload a float32 numpy array (norm weights, biases, tables) in the compute dtype."""

    def embedding(self, table: Array, token_ids: np.ndarray) -> Array:
        """Rows of `table` for integer ids [M] -> [M, H]."""

    def linear(self, x: Array, weight: Array, bias: Array | None = None) -> Array:
        """x [M, K] times weight^T -> [M, N], plus bias; K order fixed by the weight alone."""

    def rms_norm(self, x: Array, weight: Array, eps: float) -> Array:
        """Root-mean-square norm over the last dimension of x [M, K]."""

    def rope(self, x: Array, cos: Array, sin: Array) -> Array:
        """Rotary embedding (rotate-half layout) of x [M, H, D] with per-row cos/sin [M, D/2]."""

    def silu_mul(self, gate_up: Array) -> Array:
        """silu(gate) * up for gate_up [M, 2I] holding gate then up -> [M, I]."""

    def kv_buffer(self, num_kv_heads: int, capacity: int, head_dim: int,
                  previous: Array | None = None) -> Array:
        """A zero-filled key or value buffer [num_kv_heads, capacity, head_dim], holding the
        contents of `previous` (a smaller buffer) in its first positions when one is given."""

    def kv_write(self, buffer: Array, start: int, rows: Array) -> Array:
        """Store rows [M, num_kv_heads, head_dim] at positions start.. and return the buffer."""

    def attention(self, q: Array, keys: Array, values: Array, positions: np.ndarray,
                  window: int, scale: float) -> Array:
        """Causal grouped-query attention of q [M, Hq, D] at absolute `positions` [M] over the
        buffers [Hkv, capacity, D]; a query at p sees keys j <= p (and p - j < window if
        window > 0). Returns [M, Hq, D]."""

    def to_host(self, x: Array) -> np.ndarray:
        """A float32 numpy copy (or view) of x."""


def dense_matrix(weight: Any) -> np.ndarray:
    """A weight as a float32 [N, K] numpy array (quantized weights dequantize), or an error."""
    dense = np.array(weight, dtype=np.float32)
    if dense.ndim != 2:
        raise BackendError(f"a weight matrix must be 2-D, got shape {dense.shape}")
    return dense


_FACTORIES: dict[str, Callable[..., Backend]] = {}


def register_backend(name: str, factory: Callable[..., Backend]) -> None:
    """Make `get_backend(name, ...)` build a backend with `factory(device=..., dtype=...)`."""
    _FACTORIES[name] = factory


def _load_builtin(name: str) -> None:
    if name in _FACTORIES:
        return
    module = {"torch": "torch_backend", "mlx": "mlx_backend"}.get(name)
    if module is None:
        return
    try:
        importlib.import_module(f"exactdraft.backends.{module}")
    except ImportError as error:
        raise BackendError(
            f"backend {name!r} needs the {name!r} package ({error}); "
            f"install it with: pip install 'exactdraft[{name}]'"
        ) from error


def available_backends() -> list[str]:
    """Names of the built-in backends whose packages are installed, plus registered ones."""
    names = [n for n in ("torch", "mlx") if importlib.util.find_spec(n) is not None]
    return names + [n for n in _FACTORIES if n not in names]


def _auto_choice() -> tuple[str, str | None]:
    if importlib.util.find_spec("torch") is not None and importlib.util.find_spec("triton"):
        import torch

        if torch.cuda.is_available():
            return "torch", "cuda"
    on_apple = platform.system() == "Darwin" and platform.machine() == "arm64"
    if on_apple and importlib.util.find_spec("mlx") is not None:
        return "mlx", "gpu"
    if importlib.util.find_spec("torch") is not None:
        return "torch", "cpu"
    if importlib.util.find_spec("mlx") is not None:
        return "mlx", "cpu"
    raise BackendError(
        "no array backend is installed; install one with: pip install 'exactdraft[torch]'"
    )


def get_backend(name: str | Backend = "auto", device: str | None = None,
                dtype: str | None = None) -> Backend:
    """Build a backend by name ("auto", "torch", "mlx" or a registered name)."""
    if not isinstance(name, str):
        return name
    if dtype is not None and dtype not in DTYPES:
        raise BackendError(f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    if name == "auto":
        name, auto_device = _auto_choice()
        device = device or auto_device
    _load_builtin(name)
    if name not in _FACTORIES:
        known = ", ".join(sorted(set(_FACTORIES) | {"torch", "mlx"}))
        raise BackendError(f"unknown backend {name!r}; known: {known}")
    return _FACTORIES[name](device=device, dtype=dtype)
