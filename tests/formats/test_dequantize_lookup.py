"""exactdraft.formats.dequantize_lookup: iq4_nl, iq4_xs and mxfp4 blocks, bit for bit.

References: gguf-py's numpy dequantizers (random blocks, every mxfp4 exponent, and gguf's own
mxfp4 quantizer output), and ggml's C loops (dequantize_row_iq4_nl/iq4_xs/mxfp4) transcribed
element by element, which test_dequantize.py also runs (C_LOOPS) in float32 and float64. gguf
0.19 forms the same products as ggml (iq4_nl `d * v`; iq4_xs `(d * (ls - 32)) * v`; mxfp4
`2^(e - 128) * v`), each exact in float32, so every comparison is bitwise.
"""

from __future__ import annotations

import ast

import numpy as np
import pytest

import exactdraft.formats.dequantize_lookup as lookup
from exactdraft.formats import FORMATS

LOOKUP_FORMATS = ("iq4_nl", "iq4_xs", "mxfp4")
# ggml's tables, written out here as the reference (ggml-common.h).
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


@pytest.fixture(scope="module")
def gguf():
    return pytest.importorskip("gguf")


def bits(x: np.ndarray) -> bytes:
    assert x.dtype == np.float32
    return x.tobytes()


def random_blocks(fmt: str, count: int, rng) -> np.ndarray:
    """Random bytes with a finite f16 d of either sign (iq4) or any e8m0 exponent (mxfp4)."""
    row = FORMATS[fmt]
    blocks = rng.integers(0, 256, (count, row.block_bytes), dtype=np.uint8)
    if fmt != "mxfp4":
        d = 2.0 ** rng.uniform(-16, 4, count) * rng.choice([-1.0, 1.0], count)
        blocks[:, 0:2] = d.astype("<f2").view(np.uint8).reshape(count, 2)
    return blocks


def gguf_values(gguf, fmt: str, data: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return gguf.quants.dequantize(data, gguf.GGMLQuantizationType[fmt.upper()])


# --- ggml's C loops, element by element (F: the scalar type to compute in) ---------------------

def _half(b, F):
    return F(np.frombuffer(bytes(b[0:2]), dtype="<f2")[0])


def ref_iq4_nl(b, F):
    d = _half(b, F)
    qs = b[2:18]
    return ([d * F(KVALUES_IQ4NL[q & 0x0F]) for q in qs]
            + [d * F(KVALUES_IQ4NL[q >> 4]) for q in qs])


def ref_iq4_xs(b, F):
    d = _half(b, F)
    scales_h = b[2] | b[3] << 8
    y = []
    for ib in range(8):
        ls = ((b[4 + ib // 2] >> 4 * (ib % 2)) & 0x0F) | (((scales_h >> 2 * ib) & 3) << 4)
        dl = d * F(ls - 32)
        qs = b[8 + 16 * ib:24 + 16 * ib]
        y += [dl * F(KVALUES_IQ4NL[q & 0x0F]) for q in qs]
        y += [dl * F(KVALUES_IQ4NL[q >> 4]) for q in qs]
    return y


def ref_mxfp4(b, F):
    d = np.ldexp(F(1), b[0] - 128)  # ggml_e8m0_to_fp32_half: 2^(e - 127) / 2
    qs = b[1:17]
    with np.errstate(over="ignore"):
        return ([F(KVALUES_MXFP4[q & 0x0F]) * d for q in qs]
                + [F(KVALUES_MXFP4[q >> 4]) * d for q in qs])


C_LOOPS = {"iq4_nl": ref_iq4_nl, "iq4_xs": ref_iq4_xs, "mxfp4": ref_mxfp4}


# --- tests ------------------------------------------------------------------------------------

def test_tables_are_ggml_tables():
    assert tuple(lookup.IQ4_VALUES.tolist()) == KVALUES_IQ4NL
    assert tuple(lookup.MXFP4_VALUES.tolist()) == KVALUES_MXFP4


def test_rows_name_their_own_functions_and_gguf_types(gguf):
    for fmt in LOOKUP_FORMATS:
        row = FORMATS[fmt]
        kind = gguf.GGMLQuantizationType[fmt.upper()]
        assert int(kind) == row.ggml_type
        assert gguf.GGML_QUANT_SIZES[kind] == (row.block_size, row.block_bytes)
        assert row.values.__name__ == f"values_{fmt}" and row.fields.__name__ == f"fields_{fmt}"


@pytest.mark.parametrize("fmt", LOOKUP_FORMATS)
def test_random_blocks_match_gguf_bit_for_bit(gguf, fmt):
    row = FORMATS[fmt]
    data = random_blocks(fmt, 37 * 6, np.random.default_rng(1)).reshape(37, -1)
    ours = row.dequantize(data, 6 * row.block_size)
    assert ours.shape == (37, 6 * row.block_size)
    assert bits(ours) == bits(gguf_values(gguf, fmt, data))


def test_every_mxfp4_exponent_and_code_matches_gguf(gguf):
    """e = 0 and 1 give subnormal scales, e >= 253 overflows 12 * 2^(e - 128) to inf."""
    codes = np.arange(16, dtype=np.uint8)
    blocks = np.zeros((256, 17), np.uint8)
    blocks[:, 0] = np.arange(256)
    blocks[:, 1:17] = codes | (codes[::-1] << 4)
    ours = FORMATS["mxfp4"].dequantize(blocks, 32)
    assert bits(ours) == bits(gguf_values(gguf, "mxfp4", blocks))
    assert ours[0, 1] == np.float32(2.0 ** -128) and ours[128, 7] == 12.0
    assert np.isinf(ours[255]).sum() > 0 and np.isfinite(ours[:253]).all()


def test_gguf_quantized_mxfp4_matches_gguf(gguf):
    weights = np.random.default_rng(2).standard_normal((16, 256)).astype(np.float32)
    data = gguf.quants.quantize(weights, gguf.GGMLQuantizationType.MXFP4)
    ours = FORMATS["mxfp4"].dequantize(data, 256)
    assert bits(ours) == bits(gguf_values(gguf, "mxfp4", data))
    assert np.abs(ours - weights).max() < 0.5 * np.abs(weights).max()


@pytest.mark.parametrize("fmt", LOOKUP_FORMATS)
def test_blocks_match_ggml_c_loops_and_are_exact(fmt):
    row = FORMATS[fmt]
    blocks = random_blocks(fmt, 6, np.random.default_rng(3))
    ours = row.dequantize(blocks, row.block_size)
    for block, weights in zip(blocks.tolist(), ours):
        assert bits(np.array(C_LOOPS[fmt](block, np.float32), np.float32)) == bits(weights)
        exact = np.array(C_LOOPS[fmt](block, np.float64))
        assert np.array_equal(weights.astype(np.float64), exact)  # no rounding at all


@pytest.mark.parametrize("fmt", LOOKUP_FORMATS)
def test_fields_rebuild_the_weights(fmt):
    row = FORMATS[fmt]
    data = random_blocks(fmt, 20, np.random.default_rng(4)).reshape(4, -1)
    depth = 5 * row.block_size
    fields = row.block_fields(data, depth)
    assert fields.codes.dtype == np.uint8 and fields.group == 32 and fields.offset == 128
    with np.errstate(over="ignore"):
        assert bits(fields.weights()) == bits(row.dequantize(data, depth))


@pytest.mark.parametrize("fmt", LOOKUP_FORMATS)
def test_a_changed_code_or_table_changes_the_weights(fmt, monkeypatch):
    """Negative controls: one changed nibble changes one weight; a linear table (q4_0's
    code - 8) in place of the format's gives other bits."""
    row = FORMATS[fmt]
    blocks = random_blocks(fmt, 4, np.random.default_rng(5))
    if fmt == "mxfp4":
        blocks[:, 0] = 127
    before = row.dequantize(blocks, row.block_size)
    changed = blocks.copy()
    changed[1, row.block_bytes - 1] ^= 0x01
    assert (row.dequantize(changed, row.block_size) != before).sum() == 1
    table = "MXFP4_VALUES" if fmt == "mxfp4" else "IQ4_VALUES"
    monkeypatch.setattr(lookup, table, np.arange(-8, 8, dtype=np.int8))
    assert bits(row.dequantize(blocks, row.block_size)) != bits(before)


def test_module_imports_only_numpy():
    tree = ast.parse(open(lookup.__file__, encoding="utf-8").read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"numpy"}
