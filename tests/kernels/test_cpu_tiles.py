"""The tile levels of the dot layout's matmul (csrc/cpu/dot_tiles.h): `amx_emulated` (the tile
code with the tile instructions computed in C, pinned by these tests on any CPU with
avx512vnni) and `amx` (the same code on AMX, offered only where CPUID, the OS and a load-time
self-check allow it) give the avx512vnni and scalar levels' bits for every format, row count
and shape, and the amx level's absence is handled and reported. The negative control (the tile
code with its epilogue in another order is caught) is in test_cpu_levels.py, where the check
program is built."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.formats import FORMATS
from exactdraft.kernels import cpu
from tests.conftest import needs_smollm2
from tests.engine.rows import ContextRows
from tests.engine.test_batched import compare_with_alone
from tests.kernels.conftest import bits, cpu_flags
from tests.kernels.test_cpu_quantized import BLOCK_FORMATS, awkward_rows, quantized_weight
from tests.test_smollm2 import PROMPTS, drafted_runs

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

def cpu_reports_amx() -> bool | None:
    """Whether the kernel's CPU flags list AMX-TILE and AMX-INT8 (None where it lists none)."""
    flags = cpu_flags()
    return None if flags is None else {"amx_tile", "amx_int8"} <= flags


def tile_level(name: str) -> str:
    """`name` if this machine runs it, else the test is skipped with the measured reason."""
    if name == "amx" and "amx" not in cpu.simd_levels():
        pytest.skip(f"the amx level is not offered here: {cpu.amx_unavailable_reason()}")
    if name == "amx_emulated" and name not in cpu.emulated_simd_levels():
        pytest.skip("amx_emulated needs the avx512vnni level, which this CPU does not run")
    return name


def outputs(level: str, x, packed, bias) -> np.ndarray:
    default = cpu.simd_level()
    cpu.set_simd_level(level)
    try:
        return bits(cpu.matmul(x, packed, bias))
    finally:
        cpu.set_simd_level(default)


def sweep(level: str, format: str, depth: int, columns: int = 37, most_rows: int = 33) -> None:
    """Every row count 1..most_rows of one weight: `level`'s bits equal avx512vnni's and the
    scalar level's, and every row equals that row in the scalar level's widest call."""
    rng = np.random.default_rng(depth + columns)
    weight = quantized_weight(format, columns, depth, rng)
    packed = cpu.pack_matrix(weight, layout="dot")
    bias = rng.standard_normal(columns).astype(np.float32)
    x = awkward_rows(rng, most_rows, depth)
    widest = outputs("scalar", x, packed, bias)
    for rows in range(1, most_rows + 1):
        for name in (level, "avx512vnni"):
            got = outputs(name, x[:rows], packed, bias)
            assert got.tobytes() == widest[:rows].tobytes(), (name, format, depth, rows)


def depths(format: str) -> tuple[int, ...]:
    """K of one, two and an odd number (3) of the format's blocks."""
    block = max(FORMATS[format].block_size, 32)
    return (block, 2 * block, 3 * block)


@pytest.mark.parametrize("format", BLOCK_FORMATS)
@pytest.mark.parametrize("level", ["amx_emulated", "amx"])
def test_tile_levels_give_the_vnni_and_scalar_bits(level, format):
    level = tile_level(level)
    for depth in depths(format):
        sweep(level, format, depth)


@pytest.mark.parametrize("level", ["amx_emulated", "amx"])
def test_tile_levels_with_one_and_two_threads(level, restore_threads):
    """The pool's workers configure their own tiles: a wide call split over threads."""
    level = tile_level(level)
    rng = np.random.default_rng(5)
    packed = cpu.pack_matrix(quantized_weight("q4_k", 200, 512, rng), layout="dot")
    x = awkward_rows(rng, 21, 512)
    results = []
    for threads in (1, 2):
        cpu.set_num_threads(threads)
        results.append(outputs(level, x, packed, None).tobytes())
    assert results[0] == results[1] == outputs("avx512vnni", x, packed, None).tobytes()


def test_the_emulated_level_is_never_the_default():
    assert "amx_emulated" not in cpu.simd_levels()
    assert cpu.simd_level() != "amx_emulated"


def test_unknown_levels_are_refused():
    with pytest.raises(ValueError, match="not supported here"):
        cpu.set_simd_level("amx_imaginary")


@pytest.mark.skipif(cpu_reports_amx() is not False, reason="this CPU reports AMX (or no flags)")
def test_a_cpu_without_amx_has_no_amx_level():
    assert "amx" not in cpu.simd_levels()
    assert cpu.amx_unavailable_reason() == "this CPU reports no amx_tile/amx_int8 in CPUID"


def test_a_refused_permission_leaves_the_next_level(caplog):
    """The OS refusing tile data (forced here) takes the amx level away, with one log line,
    and the next level runs; probing again restores this machine's own answer."""
    before, default = cpu.simd_levels(), cpu.simd_level()
    own_reason = cpu.amx_unavailable_reason()
    expected = next(level for level in before if level != "amx")
    try:
        with caplog.at_level(logging.INFO, logger="exactdraft.kernels.cpu"):
            reason = cpu.probe_amx(refuse_permission=True, assume_cpu_support=True)
        assert reason.startswith("the OS refused AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM")
        assert "amx" not in cpu.simd_levels()
        assert cpu.simd_level() == expected
        lines = [r for r in caplog.records if "SIMD level amx not offered" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.WARNING
        assert reason in lines[0].getMessage() and f"level {expected} runs" in lines[0].getMessage()
    finally:
        assert cpu.probe_amx() == own_reason
        cpu.set_simd_level(default)
    assert cpu.simd_levels() == before


def test_the_probe_never_pretends_amx_without_the_refusal():
    with pytest.raises(ValueError, match="refuse_permission"):
        cpu.probe_amx(assume_cpu_support=True)


# -- end to end on the bundled SmolLM2 (q8_0 and q4_1 weights, dot layout) ---------------------

@pytest.fixture
def emulated_tiles():
    """The amx_emulated level pinned for the test, the default restored after."""
    level = tile_level("amx_emulated")
    default = cpu.simd_level()
    cpu.set_simd_level(level)
    yield level
    cpu.set_simd_level(default)


@pytest.mark.slow  # about 25 s: every multi-row pass runs the tiles computed in C
@needs_smollm2
def test_drafted_equals_serial_on_emulated_tiles(smollm2, emulated_tiles):
    target, tokenizer = smollm2
    check = drafted_runs(target, tokenizer, xd.PromptLookup(max_draft=8), True,
                         prompts=PROMPTS[1:2], seeds=range(1), temperatures=(0.0, 1.0))
    assert cpu.simd_level() == "amx_emulated"
    check.assert_exact()


@pytest.mark.slow  # about 30 s
@needs_smollm2
def test_shared_passes_equal_runs_alone_on_emulated_tiles(smollm2, emulated_tiles):
    target, tokenizer = smollm2
    generator = xd.Generator(target, xd.PromptLookup(max_draft=4), sampler=ContextRows(),
                             tokenizer=tokenizer, adaptive_depth=False)
    chat = [{"role": "user", "content": PROMPTS[1]}]
    requests = [(chat, dict(max_new_tokens=10, temperature=0.0)),
                (chat, dict(max_new_tokens=8, temperature=1.0, seed=3, n=2))]
    problems, stats, kept = compare_with_alone(generator, requests, max_pass_tokens=32)
    assert cpu.simd_level() == "amx_emulated"
    assert not problems, problems[:5]
    assert max(stats.sequences_per_pass) >= 3 and kept > 0
