"""exactdraft.formats.ternary_blocks: the tq1_0, tq2_0 and q1_0 blocks, bit for bit.

References: gguf 0.19's numpy dequantizers and quantizers (tq1_0, tq2_0), and element-by-element
transcriptions of ggml's C loops (dequantize_row_tq1_0, _tq2_0, _q1_0), which test_dequantize.py
runs on random blocks of every format in float32 and float64. gguf reads no q1_0, so its
reference is the C loop alone, plus the checks here.
"""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.formats import FORMATS, QuantizedTensor
from exactdraft.formats.ternary_blocks import bits_q1_0, codes_tq1_0


def _half(b: list[int], at: int, F) -> object:
    return F(np.frombuffer(bytes(b[at:at + 2]), dtype="<f2")[0])


def _ref_tq1_0(b, F):
    """ggml's loop: five trits per qs byte over 32 bytes, then over 16, four per qh byte."""
    powers = (1, 3, 9, 27, 81, 243)
    d = _half(b, 52, F)
    y = []
    for start, width, count in ((0, 32, 5), (32, 16, 5)):
        for n in range(count):
            for m in range(width):
                q = (b[start + m] * powers[n]) % 256
                y.append(F(((q * 3) >> 8) - 1) * d)
    for n in range(4):
        for j in range(4):
            q = (b[48 + j] * powers[n]) % 256
            y.append(F(((q * 3) >> 8) - 1) * d)
    return y


def _ref_tq2_0(b, F):
    d = _half(b, 64, F)
    y = []
    for j in (0, 32):
        for shift in (0, 2, 4, 6):
            for m in range(32):
                y.append(F(((b[j + m] >> shift) & 3) - 1) * d)
    return y


def _ref_q1_0(b, F):
    d = _half(b, 0, F)
    return [d if (b[2 + j // 8] >> (j % 8)) & 1 else -d for j in range(128)]


TERNARY_C_LOOPS = {"tq1_0": _ref_tq1_0, "tq2_0": _ref_tq2_0, "q1_0": _ref_q1_0}


def random_blocks(fmt: str, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    row = FORMATS[fmt]
    blocks = rng.integers(0, 256, (count, row.block_bytes), dtype=np.uint8)
    at = {"tq1_0": 52, "tq2_0": 64, "q1_0": 0}[fmt]
    scale = (2.0 ** rng.uniform(-12, 2, count) * rng.choice([-1, 1], count)).astype("<f2")
    blocks[:, at:at + 2] = scale.view(np.uint8).reshape(count, 2)
    return blocks


@pytest.mark.parametrize("fmt", ["tq1_0", "tq2_0"])
def test_gguf_quantizer_output_dequantizes_as_gguf_does(fmt):
    gguf = pytest.importorskip("gguf")
    kind = gguf.GGMLQuantizationType[fmt.upper()]
    weights = np.random.default_rng(1).standard_normal((9, 768)).astype(np.float32)
    weights[0, :256] = 0.0  # a block whose scale is 0
    blocks = gguf.quants.quantize(weights, kind)
    ours = QuantizedTensor(fmt, blocks, weights.shape).dequantize()
    theirs = gguf.quants.dequantize(blocks, kind)
    assert ours.tobytes() == theirs.astype(np.float32).tobytes()
    # Control: one changed byte of the blocks changes the weights.
    blocks[3, 5] ^= 0x01
    assert QuantizedTensor(fmt, blocks, weights.shape).dequantize().tobytes() != ours.tobytes()


def test_every_byte_reads_as_five_trits_in_ggml_order():
    """Each of the 256 byte values of qs[0] gives its trits in weights 0, 32, 64, 96, 128; the
    valid ones (below 243, which gguf's quantizer writes) give back the base-3 digits from the
    top, after the byte is scaled by 256 / 243 as the quantizer does."""
    blocks = np.zeros((256, 54), np.uint8)
    blocks[:, 0] = np.arange(256)
    trits = codes_tq1_0(blocks)[:, 0:160:32]
    for value in range(243):
        digits = [value // 3 ** (4 - n) % 3 for n in range(5)]
        stored = (value * 256 + 242) // 243
        assert trits[stored].tolist() == digits, value
    assert set(np.unique(trits)) == {0, 1, 2}


def test_q1_0_reads_bit_j_of_byte_j_over_8_with_the_sign_of_d():
    blocks = random_blocks("q1_0", 4, 2)
    blocks[0, 2:18] = 0
    blocks[0, 2] = 0b00000101  # weights 0 and 2 set
    weights = QuantizedTensor("q1_0", blocks.reshape(1, -1), (1, 512)).dequantize()[0]
    d = np.float32(blocks[0, 0:2].view("<f2")[0])
    assert weights[[0, 2]].tolist() == [d, d]
    assert weights[[1, 3, 127]].tolist() == [-d, -d, -d]
    assert bits_q1_0(blocks).sum() == sum(bin(v).count("1") for v in blocks[:, 2:].ravel())
    # Control: a reader with the bits in the other order within a byte disagrees.
    reversed_order = np.unpackbits(blocks[:, 2:18], axis=1, bitorder="big")
    assert not np.array_equal(reversed_order, bits_q1_0(blocks))


def test_q1_0_negates_a_nan_or_infinite_scale_like_ggml():
    blocks = random_blocks("q1_0", 2, 3)
    blocks[0, 0:2] = np.array([np.inf], "<f2").view(np.uint8)
    blocks[1, 0:2] = np.array([0x7E01], "<u2").view(np.uint8)  # a NaN with a payload
    ours = QuantizedTensor("q1_0", blocks.reshape(1, -1), (1, 256)).dequantize()
    expected = np.concatenate([np.array(_ref_q1_0(block.tolist(), np.float32), np.float32)
                               for block in blocks])
    assert ours.view(np.uint32).ravel().tolist() == expected.view(np.uint32).tolist()


@pytest.mark.parametrize("fmt", ["tq1_0", "tq2_0", "q1_0"])
def test_fields_rebuild_the_weights(fmt):
    """The codes and per-32 scales the CPU packs give back the dequantized bits."""
    blocks = random_blocks(fmt, 6, 4)
    depth = 6 * FORMATS[fmt].block_size // 2
    weight = QuantizedTensor(fmt, blocks.reshape(2, -1), (2, depth))
    fields = weight.row.block_fields(weight.data, depth)
    assert fields.group == 32 and fields.offset == 1
    assert set(np.unique(fields.codes)) <= ({0, 2} if fmt == "q1_0" else {0, 1, 2, 3})
    assert fields.weights().tobytes() == weight.dequantize().tobytes()
