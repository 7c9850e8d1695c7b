"""The C++ emulator for the Metal shaders: runs a kernel body from csrc/metal on the CPU inside
the very signature text MLX's `mx.fast.metal_kernel` generates for it, compiled against
csrc/metal/emu.

Invariant: an emulated launch computes what the Metal launch computes for every body inside
csrc/metal/SUBSET.md, deterministically (threadgroups in grid order, the threads of a
threadgroup as fibers in a fixed order), and a body outside the subset is refused, either here
(`check_subset`) or by the C++ compiler, instead of running on one engine and not the other.
Each (body, template, dtypes) variant is compiled once and cached by a hash of everything that
goes into it, so a stale library is never reused.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from exactdraft.kernels.metal_source import SOURCE_DIR, MetalShaderError, ShaderSpec, dtype_name

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "exactdraft" / "metal-emulator"

TYPE_NAMES = {"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t",
              "uint32": "uint32_t", "int32": "int32_t"}
_STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16,
            "uint32": np.uint32, "int32": np.int32}
# Thread attributes MLX declares when a body mentions them, in MLX's order, with their types.
ATTRIBUTES = (
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"), ("grid_origin", "uint3"), ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"), ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"), ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"), ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"), ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"), ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"), ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"), ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
)
# The emulator supplies every attribute but these (outside the subset).
_UNEMULATED = ("quadgroup", "dispatch_", "grid_origin", "grid_size")
EMULATOR_SOURCES = ("metal_emu.h", "runtime.cpp")  # in emulator_dir
COMPILE_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off",
                 "-fno-fast-math", "-Wno-attributes", "-Wno-deprecated-declarations")


def _host(value: Any) -> tuple[np.ndarray, str]:
    """A C-contiguous numpy copy of an array and its dtype name; bfloat16 as its uint16 bits."""
    name = dtype_name(value)
    if name not in TYPE_NAMES:
        raise MetalShaderError(f"unsupported array dtype {name!r}; supported: {list(TYPE_NAMES)}")
    if name == "bfloat16":
        if isinstance(value, np.ndarray):
            raise MetalShaderError("pass bfloat16 data as an mlx array")
        import mlx.core as mx

        value = value.view(mx.uint16)
    return np.ascontiguousarray(np.asarray(value)), name


def _template_text(template: Sequence[tuple[str, Any]]) -> str:
    parts = [str(int(v)) if isinstance(v, (bool, int)) else TYPE_NAMES[v] for _, v in template]
    return "<" + ", ".join(parts) + ">"


def generate_source(spec: ShaderSpec, inputs: Sequence[tuple[str, tuple[int, ...]]],
                    output_dtypes: Sequence[str], template: Sequence[tuple[str, Any]] = (),
                    instantiate: bool = True) -> tuple[str, str, list[tuple[str, int, str]]]:
    """The function name and source text MLX generates around `spec.body` for inputs given as
    (dtype name, shape), and the bindings (kind, input or output index, C++ argument) by which
    the emulator fills the parameters in order. `instantiate=False` leaves out MLX's explicit
    instantiation line, whose attributes clang rejects outside Metal."""
    name = "custom_kernel_" + spec.name
    template_def = _template_text(template) if template else ""
    if template:
        name += "_" + re.sub(r"<|>|(, )", "_", template_def)[:-1]
    for dtype, shape in inputs:
        passing = "s" if not shape else "c" if math.prod(shape) < 8 else ""
        name += f"_{TYPE_NAMES[dtype]}{passing}"
    name += "".join("_" + TYPE_NAMES[d] for d in output_dtypes)
    text = spec.header
    if template:
        kinds = ["bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "typename"
                 for _, v in template]
        text += "template <" + ", ".join(f"{k} {n}" for k, (n, _) in
                                         zip(kinds, template, strict=True)) + ">\n"
    text += f"[[kernel]] void {name}(\n"
    bindings: list[tuple[str, int, str]] = []
    for i, (input_name, (dtype, shape)) in enumerate(zip(spec.input_names, inputs, strict=True)):
        location, ref = ("constant" if math.prod(shape) < 8 else "device"), ("*" if shape else "&")
        text += f"  const {location} {TYPE_NAMES[dtype]}{ref} {input_name}"
        text += f" [[buffer({len(bindings)})]],\n"
        bindings.append(("input", i, ("" if shape else "*") + f"(const {TYPE_NAMES[dtype]}*)"))
        for suffix, c_type, cast in (("_shape", "const constant int*", "(const int*)"),
                                     ("_strides", "const constant int64_t*", "(const int64_t*)"),
                                     ("_ndim", "const constant int&", "*(const int*)")):
            if shape and input_name + suffix in spec.body:
                text += f"  {c_type} {input_name}{suffix} [[buffer({len(bindings)})]],\n"
                bindings.append((suffix[1:], i, cast))
    attributes = [(a, t) for a, t in ATTRIBUTES if a in spec.body]
    for j, (output_name, dtype) in enumerate(zip(spec.output_names, output_dtypes, strict=True)):
        index = len(bindings)
        text += f"  device {TYPE_NAMES[dtype]}* {output_name} [[buffer({index})]]"
        last = index >= len(inputs) + len(output_dtypes) - 1 and not attributes  # as MLX decides
        text += ") {\n" if last else ",\n"
        bindings.append(("output", j, f"({TYPE_NAMES[dtype]}*)"))
    for k, (attribute, c_type) in enumerate(attributes):
        text += f"  {c_type} {attribute} [[{attribute}]]" + (",\n" if k < len(attributes) - 1
                                                             else ") {\n")
        bindings.append(("attribute", k, "attributes->" + attribute))
    text += spec.body + "\n}\n"
    if template and instantiate:
        instance = name + template_def
        text += f'\ntemplate [[host_name("{name}")]] [[kernel]] decltype({instance}) {instance};\n'
    return name, text, bindings


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_THREADGROUP_WORD = re.compile(r"\bthreadgroup\b")
_THREADGROUP_ARRAY = re.compile(r"\bthreadgroup\s+\w+\s+\w+\s*\[[^\];]+\]\s*;")


def check_subset(spec: ShaderSpec) -> None:
    """Raise for what the C++ compiler alone would not catch: threadgroup memory other than a
    fixed-size array declared in the body, and thread attributes the emulator cannot supply."""
    for part, text in (("header", spec.header), ("body", spec.body)):
        code = _COMMENT.sub(" ", text)
        words = len(_THREADGROUP_WORD.findall(code))
        if words != len(_THREADGROUP_ARRAY.findall(code)) or (part == "header" and words):
            raise MetalShaderError(f"{spec.name}: threadgroup memory in the {part} is outside the "
                                   "subset (only `threadgroup T name[N];` in the body)")
    for attribute, _ in ATTRIBUTES:
        if attribute in spec.body and any(part in attribute for part in _UNEMULATED):
            raise MetalShaderError(f"{spec.name}: attribute {attribute} is outside the subset")


class Emulator:
    """Runs shader bodies on the CPU: each (body, template, dtypes) variant is compiled once into
    a shared library under `cache_dir`, keyed by a hash of everything that goes into it."""

    def __init__(self, cache_dir: Path | None = None, compiler: str = "c++",
                 reverse_thread_order: bool = False, emulator_dir: Path | None = None):
        self.cache_dir = Path(cache_dir or DEFAULT_CACHE_DIR)
        self.compiler = compiler
        self.reverse_thread_order = reverse_thread_order
        self.emulator_dir = Path(emulator_dir or SOURCE_DIR / "emu")
        self._libraries: dict[str, ctypes.CDLL] = {}
        self._common: str | None = None
        self._checked: set[ShaderSpec] = set()

    def _build(self, output: Path, sources: list[Path], extra: Sequence[str]) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.cache_dir, suffix=output.suffix)
        os.close(handle)
        command = [self.compiler, *COMPILE_FLAGS, f"-I{self.emulator_dir}", *extra,
                   *map(str, sources), "-o", temporary]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            os.unlink(temporary)
            lines = "\n".join(result.stderr.splitlines()[:40])
            raise MetalShaderError(f"emulator compile of {output.name} failed:\n{lines}")
        os.replace(temporary, output)

    def _common_text(self) -> str:
        """Compiler, flags and emulator sources, which go into every key; read once."""
        if self._common is None:
            sources = [(self.emulator_dir / name).read_text() for name in EMULATOR_SOURCES]
            self._common = "\0".join([self.compiler, *COMPILE_FLAGS, *sources])
        return self._common

    def _library(self, function: str, text: str, bindings: list, template: str) -> ctypes.CDLL:
        common = self._common_text()
        unit = '#include "metal_emu.h"\n' + text + _glue(function, template, bindings)
        key = hashlib.sha256((common + "\0" + unit).encode()).hexdigest()[:20]
        if key not in self._libraries:
            runtime_key = hashlib.sha256(common.encode()).hexdigest()[:20]
            runtime = self.cache_dir / f"runtime-{runtime_key}.o"
            if not runtime.exists():
                self._build(runtime, [self.emulator_dir / EMULATOR_SOURCES[1]], ["-c"])
            library = self.cache_dir / f"{function[:80]}-{key}.so"
            if not library.exists():
                source = self.cache_dir / f"{function[:80]}-{key}.cpp"
                source.write_text(unit)
                self._build(library, [source, runtime], ["-shared"])
            self._libraries[key] = ctypes.CDLL(str(library))
        return self._libraries[key]

    def run(self, spec: ShaderSpec, inputs: Sequence[Any], template: Sequence[tuple[str, Any]],
            grid: tuple[int, int, int], threadgroup: tuple[int, int, int],
            output_shapes: Sequence[tuple[int, ...]], output_dtypes: Sequence[str]
            ) -> list[np.ndarray]:
        """Launch `spec` like mx.fast.metal_kernel would; returns numpy arrays (bfloat16 outputs
        as uint16 bits). Outputs start as all-ones bytes (NaN), so unwritten elements show."""
        if spec not in self._checked:
            check_subset(spec)
            self._checked.add(spec)
        hosts = [_host(value) for value in inputs]
        function, text, bindings = generate_source(
            spec, [(dtype, data.shape) for data, dtype in hosts], output_dtypes, template,
            instantiate=False)
        template_def = _template_text(template) if template else ""
        library = self._library(function, text, bindings, template_def)
        outputs = [np.empty(shape, _STORAGE[dtype])
                   for shape, dtype in zip(output_shapes, output_dtypes, strict=True)]
        for output in outputs:
            output.reshape(-1).view(np.uint8).fill(255)
        buffers = []
        for kind, index, _ in bindings:
            if kind != "attribute":
                data = outputs[index] if kind == "output" else hosts[index][0]
                buffers.append(_buffer(kind, data))
        pointers = (ctypes.c_void_p * max(len(buffers), 1))(*[b.ctypes.data for b in buffers])
        error = ctypes.create_string_buffer(1024)
        status = library.metal_emu_run(
            pointers, (ctypes.c_uint32 * 3)(*grid), (ctypes.c_uint32 * 3)(*threadgroup),
            int(self.reverse_thread_order), error, len(error))
        if status != 0:
            raise MetalShaderError(f"{spec.name}: {error.value.decode()}")
        return outputs


def _buffer(kind: str, data: np.ndarray) -> np.ndarray:
    """What a binding of `kind` passes for array `data`: the array, or its shape, strides (in
    elements, as MLX passes them) or ndim."""
    if kind == "shape":
        return np.array(data.shape, np.int32)
    if kind == "strides":
        return np.array(data.strides, np.int64) // data.itemsize
    return np.array(data.ndim, np.int32) if kind == "ndim" else data


def _glue(function: str, template: str, bindings: list[tuple[str, int, str]]) -> str:
    arguments = ", ".join(cast if kind == "attribute" else f"{cast}b[{position}]"
                          for position, (kind, _, cast) in enumerate(bindings))
    return f"\nMETAL_EMU_ENTRY({function}{template}({arguments}))\n"
