"""What the Metal shaders and their emulator share: the shader sources, their interfaces, and
the errors they raise.

Invariant: a shader body is read only from csrc/metal (or the copy a wheel ships), under the
name and buffer bindings of SHADER_IO, so the Metal engine and the emulator run the same text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exactdraft.errors import BackendError

KEY_CHUNK = 64  # keys per attention chunk, aligned to absolute positions (fixed in the body)
# Where the shader sources live: csrc/metal of a source checkout (or editable install), else the
# copy an installed wheel carries as package data; the first holding matmul.metal wins.
SOURCE_DIR_CANDIDATES = (Path(__file__).resolve().parents[2] / "csrc" / "metal",
                         Path(__file__).resolve().parent / "metal_shaders")
SOURCE_DIR = next((d for d in SOURCE_DIR_CANDIDATES if (d / "matmul.metal").is_file()),
                  SOURCE_DIR_CANDIDATES[0])

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
SHADER_IO = {
    "matmul": (("x", "w"), ("out",)),
    "quantized_matmul": (("x", "w", "scales", "biases"), ("out",)),
    "rms_norm": (("x", "w", "eps"), ("out",)),
    "softmax": (("x",), ("out",)),
    "attention": (("q", "keys", "values", "positions", "window", "scale", "sinks"), ("out",)),
}


class MetalShaderError(BackendError):
    """A shader cannot be built or launched; the message says which and why."""


@dataclass(frozen=True)
class ShaderSpec:
    """A kernel body and the names MLX binds its buffers to."""

    name: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    body: str
    header: str = ""


def load_shader(name: str, source_dir: Path | None = None) -> ShaderSpec:
    """The shipped shader `name` (one of SHADER_IO) read from `source_dir`/<name>.metal."""
    if name not in SHADER_IO:
        raise MetalShaderError(f"unknown shader {name!r}; known: {', '.join(SHADER_IO)}")
    path = Path(source_dir or SOURCE_DIR) / f"{name}.metal"
    if not path.is_file():
        raise MetalShaderError(f"shader source {path} not found")
    inputs, outputs = SHADER_IO[name]
    return ShaderSpec(f"exactdraft_{name}", inputs, outputs, path.read_text())


def metal_available() -> bool:
    """Whether MLX is installed and has a Metal device."""
    try:
        import mlx.core as mx
    except ImportError:
        return False
    return bool(mx.metal.is_available())


def dtype_name(value: Any) -> str:
    """'float32', 'bfloat16', ... for a numpy or MLX array."""
    if isinstance(value, np.ndarray):
        return value.dtype.name
    return str(value.dtype).rsplit(".", 1)[-1]
