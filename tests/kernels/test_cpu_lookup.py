"""The integer-dot matmul of the lookup formats (iq4_nl, iq4_xs, mxfp4: 4-bit codes through a
16-entry table, csrc/cpu/lookup_values.h): records packed as numpy packs them from the raw
blocks, the numpy emulation's bits on every level (the tile level emulated included) for row
counts 1..33, K of one, two and three blocks and N not a multiple of 16, and records that keep
the codes at their stored width; with negative controls. The accuracy against float64 and the
row and thread invariance run in test_cpu_quantized.py, parametrized over every dot format."""

from __future__ import annotations

import numpy as np
import pytest

import exactdraft.formats.dequantize_lookup as lookup
from exactdraft.formats import FORMATS, QuantizedTensor
from exactdraft.kernels import cpu
from tests.kernels.conftest import bits
from tests.kernels.test_cpu_quantized import awkward_rows, dot_reference, quantized_weight
from tests.kernels.test_cpu_tiles import depths, outputs

pytestmark = pytest.mark.skipif(
    not cpu.available(), reason=f"CPU kernels unavailable: {cpu.unavailable_reason()}")

LOOKUP_FORMATS = tuple(name for name in ("iq4_nl", "iq4_xs", "mxfp4")
                       if FORMATS[name].integer_dot)
DOT_GROUP = 16
ALL_LEVELS = (cpu.simd_levels() + cpu.emulated_simd_levels()) if cpu.available() else ()


def _block_parts(weight) -> tuple[list[np.ndarray], np.ndarray]:
    """iq4_nl and mxfp4 per row and block of 32 (uint8 [rows, blocks, bytes] each): the
    parameters a record holds, in order, and the 16 bytes of packed nibbles (codes j and
    16 + j in byte j)."""
    row = weight.row
    count, depth = weight.shape
    raw = weight.data.reshape(count, depth // row.block_size, row.block_bytes)
    if weight.format == "iq4_nl":
        return [raw[..., 0:2]], raw[..., 2:18]
    if weight.format == "mxfp4":
        return [raw[..., 0:1]], raw[..., 1:17]
    raise ValueError(f"{weight.format} records have a super-block header")


def lookup_records(weight) -> np.ndarray:
    """kernels.h's dot layout for a lookup format from its raw blocks: per group of 16 rows and
    block of 32, each parameter of the 16 rows in turn, then the nibbles in 64-byte chunks as
    q4_0's (chunk t holds, per row, the bytes with codes 4t..4t+3 and 16 + 4t..16 + 4t + 3);
    iq4_xs's super-block header is test_cpu_pack's narrow_records."""
    if weight.format == "iq4_xs":
        from tests.kernels.test_cpu_pack import narrow_records

        return narrow_records(weight)
    count, depth = weight.shape
    blocks, groups = depth // 32, -(-count // DOT_GROUP)
    parameters, nibbles = _block_parts(weight)
    parts = []
    for part in [*parameters, nibbles]:
        padded = np.zeros((groups * DOT_GROUP, blocks, part.shape[-1]), np.uint8)
        padded[:count] = part
        if part is nibbles:
            by_lane = padded.reshape(groups, DOT_GROUP, blocks, 4, 4).transpose(0, 2, 3, 1, 4)
        else:
            by_lane = padded.reshape(groups, DOT_GROUP, blocks, -1).transpose(0, 2, 1, 3)
        parts.append(by_lane.reshape(groups, blocks, -1))
    return np.concatenate(parts, axis=-1).reshape(groups, -1)


@pytest.mark.parametrize("format", LOOKUP_FORMATS)
def test_records_keep_the_stored_codes_and_parameters(format):
    rng = np.random.default_rng(40)
    for rows in (1, 16, 37):
        weight = quantized_weight(format, rows, 2 * FORMATS[format].block_size, rng)
        packed = cpu.pack_matrix(weight, layout="dot")
        assert packed.data.tobytes() == lookup_records(weight).tobytes()


@pytest.mark.parametrize("format", LOOKUP_FORMATS)
def test_loaded_size_stays_near_the_file_size(format):
    """The records hold the 4-bit codes as nibbles and the scales at their stored width: 48
    rows of K = 1024 take at most 2% more than their GGUF blocks (iq4_xs: 276 bytes per 256
    weights against 272, its 6-bit ls kept as a byte; iq4_nl and mxfp4 take exactly the same)."""
    weight = quantized_weight(format, 48, 1024, np.random.default_rng(41))
    packed = cpu.pack_matrix(weight, layout="dot")
    ratio = packed.data.nbytes / weight.data.nbytes
    assert ratio <= 1.02, ratio
    assert packed.data.nbytes < 48 * 1024  # control: below one byte a weight


@pytest.mark.parametrize("format", LOOKUP_FORMATS)
def test_every_level_gives_the_emulation_bits(format):
    for depth in depths(format):
        rng = np.random.default_rng(depth)
        weight = quantized_weight(format, 37, depth, rng)  # 37: a partial group of 16
        packed = cpu.pack_matrix(weight, layout="dot")
        bias = rng.standard_normal(37).astype(np.float32)
        x = awkward_rows(rng, 33, depth)
        expected = bits(dot_reference(x, weight, bias))
        for level in ALL_LEVELS:
            for rows in range(1, 34):
                got = outputs(level, x[:rows], packed, bias)
                assert got.tobytes() == expected[:rows].tobytes(), (level, depth, rows)


@pytest.mark.parametrize("format", LOOKUP_FORMATS)
def test_another_table_is_caught(format, monkeypatch):
    """Negative control: the emulation with q4_0's linear table (code - 8) in place of the
    format's gives other bits than the kernel, so the comparisons above can fail."""
    rng = np.random.default_rng(42)
    weight = quantized_weight(format, 20, depths(format)[1], rng)
    x = rng.standard_normal((3, weight.shape[1])).astype(np.float32)
    kernel = bits(cpu.matmul(x, cpu.pack_matrix(weight, layout="dot")))
    assert kernel.tobytes() == bits(dot_reference(x, weight)).tobytes()
    table = "MXFP4_VALUES" if format == "mxfp4" else "IQ4_VALUES"
    monkeypatch.setattr(lookup, table, np.arange(-8, 8, dtype=np.int8))
    assert kernel.tobytes() != bits(dot_reference(x, weight)).tobytes()


@pytest.mark.skipif("mxfp4" not in LOOKUP_FORMATS, reason="mxfp4 has no dot kernel")
def test_mxfp4_subnormal_and_large_scales_on_every_level():
    """Random codes with exponents from 0 (the subnormal scale 2^-128) to 180: every level gives
    the emulation's bits, products that underflow included."""
    rng = np.random.default_rng(43)
    blocks = rng.integers(0, 256, (40 * 8, 17), dtype=np.uint8)
    blocks[:, 0] = rng.integers(0, 181, blocks.shape[0])
    blocks[:8, 0] = (0, 1, 2, 3, 0, 1, 127, 180)
    weight = QuantizedTensor("mxfp4", blocks.reshape(40, -1), (40, 256))
    packed = cpu.pack_matrix(weight, layout="dot")
    x = rng.standard_normal((9, 256)).astype(np.float32)
    expected = bits(dot_reference(x, weight)).tobytes()
    assert (bits(dot_reference(x, weight))[:, 0] != 0).any()
    for level in ALL_LEVELS:
        assert outputs(level, x, packed, None).tobytes() == expected, level
