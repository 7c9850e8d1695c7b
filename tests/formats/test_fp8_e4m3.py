"""exactdraft.formats.fp8_e4m3: the blocks of block-scaled FP8 checkpoints give, through the
format row's numpy values, the bytes of the checkpoint's own block dequantization.

The reference is exactdraft.loading.fp8_blocks.dequantize_blocks (held to torch's float8 decode
and to transformers' FP8 dequantization in tests/loading/test_fp8_blocks.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.errors import WeightError
from exactdraft.formats import BLOCK_FORMATS, FORMATS, QuantizedTensor, format_for_ggml_type
from exactdraft.formats.fp8_e4m3 import E4M3FN_VALUES, NAN_CODES
from exactdraft.loading.fp8_blocks import dequantize_blocks, fp8_e4m3_matrix

ALL_FINITE = np.array([c for c in range(256) if c not in NAN_CODES], np.uint8)


def random_fp8(rows: int, columns: int, block, seed: int, tiny: bool = False):
    """Codes of every finite value (0x00 and 0x80, subnormals, 448) and one scale per block,
    positive and negative, of normal size, or with `tiny` small enough that products of the
    smaller codes are float32 subnormals or zero."""
    rng = np.random.default_rng(seed)
    codes = rng.choice(ALL_FINITE, size=(rows, columns))
    codes.reshape(-1)[:ALL_FINITE.size] = ALL_FINITE[:codes.size]
    grid = (-(-rows // block[0]), -(-columns // block[1]))
    exponent = rng.integers(-140, -125, grid) if tiny else rng.integers(-12, 4, grid)
    scales = (rng.uniform(0.5, 1.0, grid) * 2.0 ** exponent
              * rng.choice([-1.0, 1.0], grid)).astype(np.float32)
    return codes, scales


SHAPES = [((1, 32), (128, 128)), ((37, 96), (128, 128)), ((300, 256), (128, 128)),
          ((129, 160), (16, 64)), ((5, 8 * 32), (1, 32))]


@pytest.mark.parametrize("shape,block", SHAPES)
@pytest.mark.parametrize("tiny", [False, True])
def test_values_are_the_bytes_of_the_block_dequantization(shape, block, tiny):
    codes, scales = random_fp8(*shape, block, seed=shape[0] + shape[1], tiny=tiny)
    held = fp8_e4m3_matrix(codes, scales, block)
    assert held.format == "fp8_e4m3" and held.shape == shape
    assert held.data.nbytes == shape[0] * shape[1] // 32 * 36
    reference = dequantize_blocks(codes, scales, block)
    ours = held.dequantize()
    assert ours.dtype == np.float32 and ours.tobytes() == reference.tobytes()
    if tiny:  # subnormal products are compared too, not flushed
        assert (np.abs(reference[reference != 0]) < np.finfo(np.float32).tiny).any()
    ids = np.array([shape[0] - 1, 0])
    assert held.take_rows(ids).tobytes() == reference[ids].tobytes()
    # Negative control: each block with the scale of the checkpoint block one row of blocks
    # further down (a packing that misses the block boundary) gives other bytes.
    if scales.shape[0] > 1:
        shifted = fp8_e4m3_matrix(codes, np.roll(scales, 1, axis=0), block).dequantize()
        assert shifted.tobytes() != reference.tobytes()


def test_every_code_and_negative_zero():
    codes = np.arange(256, dtype=np.uint8).reshape(8, 32)
    one = np.ones((1, 1), np.float32)
    blocks = QuantizedTensor("fp8_e4m3", fp8_e4m3_pack(codes, one), (8, 32)).dequantize()
    nan = np.isin(codes, NAN_CODES)
    assert np.isnan(blocks[nan]).all()
    assert blocks[~nan].tobytes() == E4M3FN_VALUES[codes[~nan]].tobytes()
    assert blocks.reshape(-1)[0x80].tobytes() == np.float32(-0.0).tobytes()
    assert blocks.reshape(-1)[0x01] == 2.0 ** -9 and blocks.reshape(-1)[0x7E] == 448.0
    # A negative scale flips -0.0 to +0.0, as the block dequantization does.
    flipped = QuantizedTensor("fp8_e4m3", fp8_e4m3_pack(codes, -one), (8, 32)).dequantize()
    assert flipped.reshape(-1)[0x80].tobytes() == np.float32(0.0).tobytes()
    # Negative control: +0.0 and -0.0 compare equal as values, so the byte comparison is needed.
    assert blocks.reshape(-1)[0x80] == flipped.reshape(-1)[0x80]


def fp8_e4m3_pack(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The blocks of `codes` [R, 32 k] with one scale for all, by the documented layout
    (float32 little-endian scale @0, codes @4), written out here."""
    rows, columns = codes.shape
    out = np.empty((rows, columns // 32, 36), np.uint8)
    out[..., :4] = np.frombuffer(np.asarray(scale, "<f4").reshape(-1)[:1].tobytes(), np.uint8)
    out[..., 4:] = codes.reshape(rows, -1, 32)
    return out.reshape(rows, -1)


def test_the_loader_packs_the_documented_layout():
    codes, scales = random_fp8(4, 64, (128, 128), seed=3)
    held = fp8_e4m3_matrix(codes, scales, (128, 128))
    assert held.data.tobytes() == fp8_e4m3_pack(codes, scales).tobytes()


def test_the_format_row():
    row = FORMATS["fp8_e4m3"]
    assert (row.block_size, row.block_bytes, row.float_kernel, row.integer_dot) == (32, 36,
                                                                                   True, False)
    assert row.ggml_type is None and row.affine_bits is None
    # No GGUF type id finds it, and the GGUF block formats do not list it.
    assert all(format_for_ggml_type(t) is not row for t in range(64))
    assert "fp8_e4m3" not in BLOCK_FORMATS and "q8_0" in BLOCK_FORMATS
    with pytest.raises(WeightError, match="fp8_e4m3 weights need K to be a multiple of 32"):
        QuantizedTensor("fp8_e4m3", np.zeros((2, 36), np.uint8), (2, 40))


def test_nan_codes_and_bad_scales_are_refused_as_in_the_float32_path():
    codes, scales = random_fp8(64, 128, (128, 128), seed=4)
    codes[3, 70] = 0xFF
    for read in (fp8_e4m3_matrix, dequantize_blocks):
        with pytest.raises(WeightError, match=r"tensor 'w' holds the fp8 NaN code at \(3, 70\)"):
            read(codes, scales, (128, 128), "w")
    codes[3, 70] = 0x7E
    scales[0, 0] = np.inf
    for read in (fp8_e4m3_matrix, dequantize_blocks):
        with pytest.raises(WeightError, match=r"tensor 'w_scale_inv' holds inf at \(0, 0\)"):
            read(codes, scales, (128, 128), "w")
    scales[0, 0] = 1.0
    assert fp8_e4m3_matrix(codes, scales, (128, 128), "w").shape == (64, 128)  # control


@pytest.mark.parametrize("shape,block", [((8, 48), (128, 128)), ((8, 64), (16, 16)),
                                         ((8, 64), (128, 48))])
def test_matrices_whose_blocks_straddle_32_weights_are_refused(shape, block):
    codes, scales = random_fp8(*shape, block, seed=5)
    with pytest.raises(WeightError, match="does not fit fp8_e4m3"):
        fp8_e4m3_matrix(codes, scales, block, "w")
