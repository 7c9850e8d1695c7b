"""Backends by name: the built-in ones, registered ones, and the choice "auto" makes.

Invariant: a backend is built only by its factory, imported on first use, so the package imports
with none of torch, mlx or triton installed; a name that is unknown or whose package is missing
gets a BackendError saying what to install.
"""

from __future__ import annotations

import importlib.util
import platform
import warnings
from collections.abc import Callable

from exactdraft.backends.base import DTYPES, Backend
from exactdraft.errors import BackendError

_FACTORIES: dict[str, Callable[..., Backend]] = {}
BUILTIN = ("torch", "torch-padded", "mlx")


def register_backend(name: str, factory: Callable[..., Backend]) -> None:
    """Make `get_backend(name, ...)` build a backend with `factory(device=..., dtype=...)`."""
    _FACTORIES[name] = factory


def _needs(package: str, name: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise BackendError(f"backend {name!r} needs the {package!r} package; install it with: "
                           f"pip install {package} (or, in an exactdraft checkout, pip "
                           f"install -e \".[{package}]\")")


def torch_backend(device: str | None = None, dtype: str | None = None) -> Backend:
    """The best row-invariant torch backend for a device: Triton kernels on cuda, the C
    kernels on cpu, and the padded torch ops when the C kernels are unavailable (warned)."""
    _needs("torch", "torch")
    device = device or "cpu"
    if device.startswith("cuda"):
        from exactdraft.backends.torch_cuda import TorchCudaBackend

        return TorchCudaBackend(device=device, dtype=dtype)
    from exactdraft.kernels import cpu

    if cpu.available() and (dtype or "float32") in ("float32", "bfloat16"):
        from exactdraft.backends.torch_cpu import TorchCPUBackend

        return TorchCPUBackend(device=device, dtype=dtype)
    if not cpu.available():
        warnings.warn(f"exactdraft's C kernels are unavailable ({cpu.unavailable_reason()}); "
                      "using the slower padded torch path", RuntimeWarning, stacklevel=3)
    return padded_torch_backend(device=device, dtype=dtype)


def padded_torch_backend(device: str | None = None, dtype: str | None = None) -> Backend:
    _needs("torch", "torch-padded")
    from exactdraft.backends.torch_backend import TorchBackend

    return TorchBackend(device=device, dtype=dtype)


def mlx_backend(device: str | None = None, dtype: str | None = None) -> Backend:
    _needs("mlx", "mlx")
    from exactdraft.backends.mlx_backend import MLXBackend

    return MLXBackend(device=device, dtype=dtype)


_BUILTIN_FACTORIES = {"torch": torch_backend, "torch-padded": padded_torch_backend,
                      "mlx": mlx_backend}


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
        "no array backend is installed; install one with: pip install torch (or, in an "
        "exactdraft checkout, pip install -e \".[torch]\")"
    )


def get_backend(name: str | Backend = "auto", device: str | None = None,
                dtype: str | None = None) -> Backend:
    """Build a backend by name ("auto", "torch", "torch-padded", "mlx" or a registered name);
    a backend object passes through unchanged."""
    if not isinstance(name, str):
        return name
    if dtype is not None and dtype not in DTYPES:
        raise BackendError(f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
    if name == "auto":
        name, auto_device = _auto_choice()
        device = device or auto_device
    factory = _FACTORIES.get(name) or _BUILTIN_FACTORIES.get(name)
    if factory is None:
        known = ", ".join(sorted(set(_FACTORIES) | set(_BUILTIN_FACTORIES)))
        raise BackendError(f"unknown backend {name!r}; known: {known}")
    return factory(device=device, dtype=dtype)
