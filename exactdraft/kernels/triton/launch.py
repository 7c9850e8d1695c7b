"""Host-side checks shared by the Triton kernels: where a kernel can run and in which form.

Invariant: every launch of a kernel for a given weight shape, head layout or row length uses one
compiled configuration, whatever the number of rows. Row counts and positions are passed as
runtime values that Triton never specialises on, and every tensor is handed over contiguous and
16-byte aligned so that Triton's alignment specialisation cannot pick a second variant either.
CUDA tensors run compiled kernels; CPU tensors run only under Triton's interpreter, which has to
be switched on (TRITON_INTERPRET=1) before triton is first imported.
"""

from __future__ import annotations

from typing import Any

from exactdraft.errors import ParameterError

ALIGNMENT_BYTES = 16
# Compiler options that change rounding are pinned rather than left to Triton's defaults, which
# move between releases (Triton 3.10 turns multiply-add fusion off by default).
PINNED_OPTIONS = {"enable_fp_fusion": True}
DTYPE_NAMES = ("float32", "bfloat16", "float16")
# Which reduction a kernel's dot step uses: "native" is tl.dot (tensor cores on CUDA);
# "rowwise" multiplies and sums with elementwise ops, so each output element is reduced by
# itself and no row can influence another; "auto" picks native for compiled kernels and rowwise
# under the interpreter, whose tl.dot is numpy's matmul (and garbage for bfloat16).
DOT_MODES = ("auto", "native", "rowwise")


class KernelError(ParameterError):
    """A kernel cannot run on the given inputs; the message names the offending value."""


def interpreted(kernel: Any) -> bool:
    """Whether a @triton.jit kernel was built for Triton's CPU interpreter."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def check_device(kernel: Any, *tensors: Any) -> str:
    """The device type all `tensors` share ("cuda" or "cpu"), if `kernel` can run there."""
    device_types = {t.device.type for t in tensors}
    if len(device_types) != 1:
        raise KernelError(f"inputs are on several devices: {sorted(device_types)}")
    device_type = device_types.pop()
    if device_type == "cpu" and not interpreted(kernel):
        raise KernelError(
            "CPU tensors run the Triton kernels only under Triton's interpreter; set "
            "TRITON_INTERPRET=1 in the environment before triton is first imported"
        )
    if device_type not in ("cpu", "cuda"):
        raise KernelError(f"unsupported device type {device_type!r}; supported: cuda, cpu")
    return device_type


def rowwise_dot(dot: str, kernel: Any) -> bool:
    """Resolve a DOT_MODES value to the ROWWISE flag of `kernel`."""
    if dot not in DOT_MODES:
        raise KernelError(f"unknown dot mode {dot!r}; known: {', '.join(DOT_MODES)}")
    if dot == "auto":
        return interpreted(kernel)
    return dot == "rowwise"


def dtype_name(tensor: Any) -> str:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPE_NAMES:
        raise KernelError(f"unsupported dtype {name!r}; supported: {', '.join(DTYPE_NAMES)}")
    return name


def aligned(tensor: Any) -> Any:
    """`tensor` itself when contiguous and 16-byte aligned, else an aligned contiguous copy."""
    if tensor.is_contiguous() and tensor.data_ptr() % ALIGNMENT_BYTES == 0:
        return tensor
    copy = tensor.contiguous()
    if copy.data_ptr() % ALIGNMENT_BYTES:
        copy = copy.clone()
    return copy


def next_power_of_2(value: int) -> int:
    return 1 if value <= 1 else 1 << (value - 1).bit_length()
