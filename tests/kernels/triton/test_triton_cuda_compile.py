"""The compiled (CUDA) form of every kernel builds for Hopper and Ampere on this GPU-less machine.

The interpreter tests run the rowwise dot step; this compiles the tl.dot step that a GPU runs,
through Triton's own compiler down to a cubin, so a kernel that only a GPU would reject fails
here first. It runs in a subprocess because this test session has the interpreter switched on.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="the Triton kernel tests need the triton package")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

SCRIPT = r"""
import re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from exactdraft.kernels.triton import attention, launch, matmul, norm, softmax

arch = int(sys.argv[1])
found = {}

def build(kernel, types, constants, **options):
    signature = dict(types, **{name: "constexpr" for name in constants})
    options.update(launch.PINNED_OPTIONS)
    compiled = triton.compile(ASTSource(kernel, signature=signature, constexprs=constants),
                              target=GPUTarget("cuda", arch, 32), options=options)
    found[kernel.__name__] = sorted(set(re.findall(r"\b(mma\.sync\S*|wgmma\S*)",
                                                   compiled.asm["ptx"])))
    assert compiled.asm["cubin"]

for dtype in ("bf16", "fp32"):
    element = f"*{dtype}"
    build(matmul._matmul_kernel,
          dict(x_ptr=element, w_ptr=element, bias_ptr=element, out_ptr=element, M="i32",
               N="i32", K="i32"),
          dict(HAS_BIAS=True, ROWWISE=False, IEEE_FP32=dtype == "fp32", BLOCK_M=16,
               BLOCK_N=32, BLOCK_K=128 if dtype == "bf16" else 64),
          num_warps=4, num_stages=4)
    build(norm._rms_norm_kernel, dict(x_ptr=element, weight_ptr=element, out_ptr=element,
                                      K="i32", eps="fp32"), dict(BLOCK=4096), num_warps=4)
    build(softmax._softmax_kernel, dict(x_ptr=element, out_ptr="*fp32", V="i32"),
          dict(LOG=True, BLOCK=4096), num_warps=4)
    build(attention._chunk_kernel,
          dict(q_ptr=element, k_ptr=element, v_ptr=element, pos_ptr="*i32", max_ptr="*fp32",
               sum_ptr="*fp32", acc_ptr="*fp32", M="i32", capacity="i32", num_chunks="i32",
               window="i32", scale="fp32"),
          dict(HEADS=9, GROUP=3, GROUP_PADDED=4, D=64, D_PADDED=64, BLOCK_M=4, CHUNK=512,
               TILE=64, ROWWISE=False, IEEE_FP32=dtype == "fp32"), num_warps=4)
    for sinks in (False, True):
        build(attention._merge_kernel,
              dict(pos_ptr="*i32", max_ptr="*fp32", sum_ptr="*fp32", acc_ptr="*fp32",
                   out_ptr=element, sink_ptr="*fp32", num_chunks="i32", window="i32"),
              dict(HEADS=9, HEADS_PADDED=16, D=64, D_PADDED=64, CHUNK=512, HAS_SINKS=sinks),
              num_warps=4)
    if dtype == "bf16":
        print("bf16", found["_matmul_kernel"], found["_chunk_kernel"])
print("ok")
"""


@pytest.mark.parametrize("arch", [90, pytest.param(80, marks=pytest.mark.slow)])
def test_the_native_kernels_compile_for_cuda(arch):
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    env.pop("TRITON_INTERPRET", None)
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(arch)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.split("\n")
    assert lines[-2:] == ["ok", ""]
    # bf16 matmul and attention go to the tensor cores (mma.sync m16n8k16, 16-row tiles).
    assert lines[0].count("mma.sync.aligned.m16n8k16") == 2, lines[0]
