"""Every SIMD level the package builds gives the scalar level's bits (the canonical arithmetic),
kernel by kernel and for whole decoder layers: csrc/cpu/check_levels.c built with the level
objects and run natively, under qemu for arm64 NEON, and with the x86 levels built on SIMDe
(the slow job, on every x86 machine) so that levels a CPU lacks are checked too. The amx level's
tile code runs everywhere avx512vnni does as amx_emulated (the tile instructions computed in
C), and natively where the CPU and OS offer amx.

The tools come from Debian packages that scripts/install.sh installs when it can (gcc, and
gcc-aarch64-linux-gnu, qemu-user and libsimde-dev); a test whose tool is missing is skipped
with the reason, and CI prints skip reasons (-rs).
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from exactdraft.kernels import cpu
from tests.kernels.conftest import cpu_flags

SOURCES = Path(__file__).resolve().parents[2] / "csrc" / "cpu"
# The extension's own flags (setup.py), so the checked objects are the ones users run.
FLAGS = ["-std=c11", "-O3", "-ffp-contract=off", "-fno-math-errno", "-pthread", f"-I{SOURCES}"]
# The scalar reference is the portable struct build of vec_scalar.h (what compilers without
# vector types get), at -O0: under a second where -O3 takes half a minute, and the same bits
# either way (every step is an explicit IEEE operation, fused multiply-adds are fmaf calls,
# contraction is off). The scalar level's FMA build is the vector-type build the extension
# runs, compiled quickly (-O1) and compared with it, so both spellings of the canonical
# arithmetic are checked against each other; the extension's own -O3 objects are held to the
# committed logits hashes by tests/test_portability.py.
OBJECT_FLAGS = {"level_scalar": ["-O0", "-DEXACTDRAFT_STRUCT_VECTORS"],
                "level_scalar_fma": ["-O1"]}
COMMON = ["dispatch", "thread_pool", "decoder_layer", "check_levels", "level_scalar",
          "amx_probe", "random_problems"]
X86 = ["level_avx2", "level_avx512", "level_avx512vnni", "level_scalar_fma", "level_amx",
       "level_amx_emulated"]
X86_LEVELS = ("avx2", "avx512", "avx512vnni", "amx")
# The check program also checks the levels only tests select (amx_emulated, where avx512vnni
# runs): the amx level's tile code with the tile instructions computed in C.
EMULATED_LEVELS = len(cpu.emulated_simd_levels()) if cpu.available() else 0
# On SIMDe every x86 level runs but amx (SIMDe has no tile instructions), and amx_emulated.
SIMDE_LEVELS = ("avx2", "avx512", "avx512vnni", "amx_emulated")
ON_X86 = platform.machine() in ("x86_64", "AMD64")
SIMDE_HEADER = Path("/usr/include/simde/x86/avx512.h")
# Where the CPU has FMA (every CPU with the avx2 level), the check program also compares the
# scalar level's FMA build (level_scalar_fma.c) with the portable one.
SCALAR_FMA = int(ON_X86 and cpu.available() and "avx2" in cpu.simd_levels())


def build(folder: Path, compiler: str, levels: list[str], extra: list[str] = (),
          link: list[str] = (), rebuild: tuple[str, ...] | None = None) -> Path:
    """The check program built from the level files with `compiler` (objects in parallel);
    with `rebuild`, only those objects are compiled again, the others reused from `folder`."""
    def compile_one(name: str) -> str:
        target = folder / f"{name}.o"
        if rebuild is None or name in rebuild or not target.is_file():
            subprocess.run([compiler, *FLAGS, *OBJECT_FLAGS.get(name, []), *extra, "-c",
                            str(SOURCES / f"{name}.c"), "-o", str(target)],
                           check=True, capture_output=True, text=True)
        return str(target)

    with ThreadPoolExecutor(max_workers=2) as pool:
        objects = list(pool.map(compile_one, COMMON + levels))
    program = folder / "check_levels"
    subprocess.run([compiler, "-pthread", *link, "-o", str(program), *objects, "-lm"],
                   check=True, capture_output=True, text=True)
    return program


# -O1: SIMDe's headers make -O3 builds slow, and the bits do not depend on it.
EMULATED = ["-DEXACTDRAFT_EMULATE_X86", "-O1", "-Wno-psabi"]


@pytest.fixture(scope="module")
def emulated_folder(tmp_path_factory) -> Path:
    """The SIMDe build's objects, shared by the tests that build it."""
    return tmp_path_factory.mktemp("emulated")


@pytest.fixture(scope="module")
def x86_folder(tmp_path_factory) -> Path:
    """Where the native x86 objects are built once for this module."""
    return tmp_path_factory.mktemp("levels")


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def assert_all_same(result: subprocess.CompletedProcess, levels: int) -> None:
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr
    assert f"all checks passed ({levels} levels against scalar)" in result.stdout
    assert "DIFFERENT" not in result.stdout
    assert result.stdout.count("same bits") >= 40 * levels


def needs(*tools: str) -> None:
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (Debian: see scripts/install.sh)")


@pytest.mark.skipif(not ON_X86, reason="the x86 levels are built on x86-64 only")
def test_native_x86_levels_give_the_scalar_bits(x86_folder):
    needs("gcc")
    runnable = [level for level in X86_LEVELS if cpu.available() and level in cpu.simd_levels()]
    if not runnable:
        pytest.skip("this CPU runs no x86 SIMD level natively")
    program = build(x86_folder, "gcc", X86)
    assert_all_same(run([str(program)]), len(runnable) + SCALAR_FMA + EMULATED_LEVELS)


def failing_check(x86_folder: Path, folder: Path, define: str, rebuilt: str,
                  extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The check program (native, or as `extra` flags build it) with `rebuilt` compiled again
    with -D`define` (the other objects reused from x86_folder, built there where missing), run;
    it must report failed checks."""
    build(x86_folder, "gcc", X86, extra=extra, rebuild=())  # only the objects not there yet
    for reused in x86_folder.glob("*.o"):
        shutil.copy(reused, folder / reused.name)
    program = build(folder, "gcc", X86, extra=[*extra, f"-D{define}"], rebuild=(rebuilt,))
    result = run([str(program)])
    assert result.returncode == 1 and "CHECKS FAILED" in result.stdout
    return result


@pytest.mark.skipif(not ON_X86, reason="the x86 levels are built on x86-64 only")
def test_the_level_check_catches_a_reordered_tile_epilogue(x86_folder, tmp_path):
    """Negative control: the tile level with each block's scales multiplied in another order
    (s_w * (d_x * isum)) is reported as different, on its multi-row dot checks only (one row
    runs on the avx512vnni kernel)."""
    needs("gcc")
    if not EMULATED_LEVELS:
        pytest.skip("amx_emulated needs the avx512vnni level, which this CPU does not run")
    result = failing_check(x86_folder, tmp_path, "EXACTDRAFT_REORDERED_TILE_EPILOGUE",
                           "level_amx_emulated")
    different = [line for line in result.stdout.splitlines() if "DIFFERENT" in line]
    assert different and all(line.startswith("amx_emulated") for line in different)
    assert any(" dot q4_1 7 x" in line for line in different)
    assert not any(" dot q4_1 1 x" in line for line in different)


@pytest.mark.skipif(not ON_X86, reason="the x86 levels are built on x86-64 only")
def test_the_level_check_catches_a_sink_merged_after_the_keys(x86_folder, tmp_path):
    """Negative control: the avx512 level with each head's sink merged once after the last key
    tile instead of before the first (the same softmax in another order) is reported as
    different, on its attention checks with sinks only."""
    needs("gcc")
    if not cpu.available() or "avx512" not in cpu.simd_levels():
        pytest.skip("this CPU does not run the avx512 level")
    result = failing_check(x86_folder, tmp_path, "EXACTDRAFT_SINK_AFTER_KEYS", "level_avx512")
    different = [line for line in result.stdout.splitlines() if "DIFFERENT" in line]
    assert different and all(line.split()[0] == "avx512" and line.split()[-2] == "sinks"
                             for line in different)
    assert any("tree attention" in line for line in different)
    assert any("window 17 sinks" in line for line in different)


@pytest.mark.skipif(not ON_X86, reason="the x86 levels are built on x86-64 only")
def test_the_level_check_catches_a_wrong_sign_table(x86_folder, tmp_path):
    """Negative control: the avx512vnni level with one entry of q1_0's lookup tables one too
    large is reported as different, on q1_0's dot checks only: the check program runs the
    lookup (dot_sign_lookup.h) wherever the CPU has VBMI."""
    needs("gcc")
    if not cpu.available() or "avx512vnni" not in cpu.simd_levels():
        pytest.skip("this CPU does not run the avx512vnni level")
    if "avx512vbmi" not in (cpu_flags() or set()):
        pytest.skip("this CPU lacks AVX-512 VBMI (no avx512vbmi in /proc/cpuinfo): "
                    "q1_0 takes the bytewise path")
    result = failing_check(x86_folder, tmp_path, "EXACTDRAFT_SIGN_TABLE_MISTAKE",
                           "level_avx512vnni")
    different = [line for line in result.stdout.splitlines() if "DIFFERENT" in line]
    assert different and all(" dot q1_0 " in line for line in different)
    assert any(line.startswith("avx512vnni ") for line in different)


@pytest.mark.slow
@pytest.mark.skipif(not ON_X86, reason="the x86 levels are built on x86-64 only")
def test_the_level_check_catches_a_non_canonical_level(x86_folder, tmp_path):
    """Negative control: a scalar level with an unfused multiply-add (what the scalar level
    did before the arithmetic was made canonical) is reported as different."""
    needs("gcc")
    if not cpu.available() or not set(X86_LEVELS) & set(cpu.simd_levels()):
        pytest.skip("this CPU runs no x86 SIMD level natively")
    result = failing_check(x86_folder, tmp_path, "EXACTDRAFT_UNFUSED_SCALAR", "level_scalar")
    assert "DIFFERENT" in result.stdout


@pytest.mark.slow
@pytest.mark.skipif(not ON_X86, reason="the x86 levels are built on x86-64 only")
def test_emulated_x86_levels_give_the_scalar_bits(emulated_folder):
    """Every x86 level on SIMDe, on any x86 machine (the one check of levels a CPU lacks)."""
    needs("gcc")
    if not SIMDE_HEADER.is_file():
        pytest.skip(f"needs the SIMDe headers ({SIMDE_HEADER}; Debian: libsimde-dev)")
    program = build(emulated_folder, "gcc", X86, extra=EMULATED)
    assert_all_same(run([str(program)]), len(SIMDE_LEVELS) + SCALAR_FMA)


@pytest.mark.slow
@pytest.mark.skipif(not ON_X86, reason="the x86 levels are built on x86-64 only")
def test_the_emulated_level_check_catches_a_wrong_sign_table(emulated_folder, tmp_path):
    """Negative control on SIMDe, where the avx512vnni level runs q1_0's lookup on any x86
    machine: one table entry one too large is reported as different, on q1_0's checks only."""
    needs("gcc")
    if not SIMDE_HEADER.is_file():
        pytest.skip(f"needs the SIMDe headers ({SIMDE_HEADER}; Debian: libsimde-dev)")
    result = failing_check(emulated_folder, tmp_path, "EXACTDRAFT_SIGN_TABLE_MISTAKE",
                           "level_avx512vnni", extra=tuple(EMULATED))
    different = [line for line in result.stdout.splitlines() if "DIFFERENT" in line]
    assert different and all(" dot q1_0 " in line for line in different)
    assert any(line.startswith("avx512vnni ") and " dot q1_0 1 x 256 x 121" in line
               for line in different)


@pytest.mark.slow
def test_neon_level_gives_the_scalar_bits_under_qemu(tmp_path):
    if platform.machine() in ("aarch64", "arm64"):
        needs("gcc")
        assert_all_same(run([str(build(tmp_path, "gcc", ["level_neon"]))]), 1)
        return
    needs("aarch64-linux-gnu-gcc", "qemu-aarch64")
    program = build(tmp_path, "aarch64-linux-gnu-gcc", ["level_neon"], link=["-static"])
    assert_all_same(run(["qemu-aarch64", str(program)]), 1)
