"""Run the Triton kernel tests on CPU tensors through Triton's interpreter.

Triton reads TRITON_INTERPRET when it is first imported, so it is set here, before any test
module of this directory imports triton; each module skips itself (with the reason) when triton
is not installed. This folder is the package tests.kernels.triton; it must never be importable
as a top-level "triton" (that would shadow the real package), so tests/ and tests/kernels/ stay
packages too.
"""

from __future__ import annotations

import os
import sys

import pytest

if "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(autouse=True)
def _interpreter_active():
    """Fail loudly (not skip) when triton was imported before the interpreter was switched on."""
    from triton.runtime.interpreter import InterpretedFunction

    from exactdraft.kernels.triton.matmul import _matmul_kernel

    if not isinstance(_matmul_kernel, InterpretedFunction):
        pytest.fail("triton was imported before TRITON_INTERPRET=1 was set; set it in the "
                    "environment or in tests/conftest.py so CPU tests can run the kernels")


@pytest.fixture(autouse=True)
def _fixed_random_state():
    """Tests draw from torch's global generator too; seed it so no test depends on order."""
    import torch

    torch.manual_seed(1234)


@pytest.fixture
def same_bits():
    """Compare tensors bit for bit (torch.equal alone calls -0.0 and +0.0 equal)."""
    import torch

    widths = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def compare(a, b) -> bool:
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        as_int = widths[a.element_size()]
        return torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int))

    return compare
