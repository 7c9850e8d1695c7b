"""The arm64 NEON level of the C kernels, checked against the scalar level on this x86 machine:
csrc/cpu/check_levels.c is cross-compiled with the NEON and scalar level files and run under
qemu's arm64 user-mode emulator. It checks that the integer-dot path gives the same bits on both
levels and that NEON's vf_sum_lanes reproduces vf_sum bit for bit.

Needs aarch64-linux-gnu-gcc and qemu-aarch64 (Debian: gcc-aarch64-linux-gnu, qemu-user); the
test is skipped without them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCES = Path(__file__).resolve().parents[2] / "csrc" / "cpu"
COMPILER, EMULATOR = "aarch64-linux-gnu-gcc", "qemu-aarch64"


@pytest.mark.skipif(shutil.which(COMPILER) is None or shutil.which(EMULATOR) is None,
                    reason=f"needs {COMPILER} and {EMULATOR}")
def test_neon_level_agrees_with_the_scalar_level(tmp_path):
    flags = ["-O2", "-std=c11", "-ffp-contract=off", "-fno-math-errno", f"-I{SOURCES}"]
    objects = []
    for name in ("level_neon", "level_scalar", "check_levels"):
        target = tmp_path / f"{name}.o"
        # -fno-tree-vectorize for the check program only: gcc 12's arm64 vectorizer crashes on
        # its loops; the level files build with the extension's flags.
        extra = ["-fno-tree-vectorize"] if name == "check_levels" else []
        subprocess.run([COMPILER, *flags, *extra, "-c", str(SOURCES / f"{name}.c"), "-o",
                        str(target)], check=True, capture_output=True, text=True)
        objects.append(str(target))
    program = tmp_path / "check_levels"
    subprocess.run([COMPILER, "-static", "-o", str(program), *objects, "-lm"], check=True,
                   capture_output=True, text=True)
    result = subprocess.run([EMULATOR, str(program)], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout
    assert result.stdout.count("same bits") == 9
