"""Per-op row invariance of the torch CPU backend, bit for bit, with negative controls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from exactdraft.backends.registry import get_backend
from exactdraft.backends.torch_backend import TorchBackend
from exactdraft.errors import BackendError

ROW_COUNTS = list(range(1, 17)) + [31, 64, 100, 257]
SCALES = [1.0, 1e4, 1e-4]


@pytest.fixture(scope="module")
def backend() -> TorchBackend:
    return TorchBackend()


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit: torch.equal calls -0.0 and +0.0 equal, raw bytes do not."""
    return a.shape == b.shape and a.dtype == b.dtype and \
        a.contiguous().numpy().tobytes() == b.contiguous().numpy().tobytes()


def rows_alone_equal_rows_together(op, inputs: torch.Tensor, counts=ROW_COUNTS) -> None:
    alone = [op(inputs[i:i + 1]) for i in range(max(counts))]
    for count in counts:
        together = op(inputs[:count])
        for row in range(count):
            assert same_bytes(together[row:row + 1], alone[row]), (count, row)


def test_the_comparison_tells_zero_signs_apart():
    zero = torch.zeros(3)
    assert torch.equal(zero, -zero) and not same_bytes(zero, -zero)


def random(shape, scale, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("k,n", [(64, 96), (576, 1536), (1536, 576)])
def test_linear_rows_are_invariant(backend, scale, k, n):
    weight = backend.matrix(random((n, k), 0.05, 1).numpy())
    bias = backend.vector(random((n,), 1.0, 2).numpy())
    rows_alone_equal_rows_together(lambda x: backend.linear(x, weight, bias),
                                   random((max(ROW_COUNTS), k), scale, 3))


@pytest.mark.parametrize("scale", SCALES)
def test_rms_norm_rows_are_invariant(backend, scale):
    weight = backend.vector(random((96,), 1.0, 4).numpy())
    rows_alone_equal_rows_together(lambda x: backend.rms_norm(x, weight, 1e-6),
                                   random((max(ROW_COUNTS), 96), scale, 5))


@pytest.mark.parametrize("scale", SCALES)
def test_silu_mul_rows_are_invariant(backend, scale):
    rows_alone_equal_rows_together(backend.silu_mul, random((max(ROW_COUNTS), 2 * 77), scale, 6))


def test_rope_rows_are_invariant(backend):
    inputs = random((max(ROW_COUNTS), 3, 16), 1.0, 7)
    angles = np.arange(max(ROW_COUNTS))[:, None] * 0.3 ** np.arange(8)
    cos, sin = torch.from_numpy(np.cos(angles)).float(), torch.from_numpy(np.sin(angles)).float()
    alone = [backend.rope(inputs[i:i + 1], cos[i:i + 1], sin[i:i + 1]) for i in range(50)]
    for count in (1, 2, 3, 5, 16, 50):
        together = backend.rope(inputs[:count], cos[:count], sin[:count])
        for row in range(count):
            assert same_bytes(together[row:row + 1], alone[row])


def attention_case(backend, capacity, heads=4, kv_heads=2, dim=16, seed=0):
    keys = backend.kv_buffer(kv_heads, capacity, dim)
    values = backend.kv_buffer(kv_heads, capacity, dim)
    keys[:] = random((kv_heads, capacity, dim), 2.0, seed)
    values[:] = random((kv_heads, capacity, dim), 1.0, seed + 1)
    queries = random((capacity, heads, dim), 2.0, seed + 2)
    return queries, keys, values


@pytest.mark.parametrize("window", [0, 5, 300])
@pytest.mark.parametrize("start", [0, 1, 250, 255, 256, 300])
def test_attention_rows_are_invariant(backend, window, start):
    """A query's output depends only on keys up to its own position: not on how many queries
    share the call, nor on what the cache holds past it, nor on the buffer's capacity."""
    queries, keys, values = attention_case(backend, capacity=768)
    scale = 0.25
    alone = {}
    for p in range(start, start + 17):
        # Alone: a smaller buffer holding only keys up to p, zeros after.
        capacity = (p // backend.key_block + 1) * backend.key_block
        small_keys = backend.kv_buffer(2, capacity, 16)
        small_values = backend.kv_buffer(2, capacity, 16)
        small_keys[:, :p + 1] = keys[:, :p + 1]
        small_values[:, :p + 1] = values[:, :p + 1]
        alone[p] = backend.attention(queries[p:p + 1], small_keys, small_values,
                                     np.array([p]), window, scale)
    for count in (1, 2, 3, 4, 7, 16, 17):
        positions = np.arange(start, start + count)
        together = backend.attention(queries[start:start + count], keys, values, positions,
                                     window, scale)
        for row, p in enumerate(positions):
            assert same_bytes(together[row:row + 1], alone[int(p)]), (count, row)


def test_attention_matches_float64_reference(backend):
    queries, keys, values = attention_case(backend, capacity=512, seed=3)
    positions = np.arange(290, 300)
    out = backend.attention(queries[290:300], keys, values, positions, 0, 0.25).double()
    q = queries[290:300].double()
    k = keys.double().repeat_interleave(2, 0)
    v = values.double().repeat_interleave(2, 0)
    for row, p in enumerate(positions):
        scores = torch.einsum("hd,hjd->hj", q[row], k[:, :p + 1]) * 0.25
        expected = torch.einsum("hj,hjd->hd", torch.softmax(scores, -1), v[:, :p + 1])
        assert ((out[row] - expected).abs() <= 1e-5 + 1e-5 * expected.abs()).all()


# Negative controls: what the backend avoids does break rows on this machine.

def test_negative_control_unpadded_matmul():
    x, w = random((8, 576), 1.0, 8), random((576, 1536), 0.05, 9)
    assert not all(same_bytes((x @ w)[i], (x[i:i + 1] @ w)[0]) for i in range(8))


def test_negative_control_scaled_dot_product_attention(backend):
    queries, keys, values = attention_case(backend, capacity=256)
    k, v = keys[:, :64].repeat_interleave(2, 0), values[:, :64].repeat_interleave(2, 0)
    mask = torch.arange(64)[None, :] <= torch.arange(48, 64)[:, None]
    together = torch.nn.functional.scaled_dot_product_attention(
        queries[48:64].transpose(0, 1), k, v, attn_mask=mask)
    alone = [torch.nn.functional.scaled_dot_product_attention(
        queries[p:p + 1].transpose(0, 1), k[:, :p + 1], v[:, :p + 1]) for p in range(48, 64)]
    assert not all(same_bytes(together[:, i:i + 1], alone[i]) for i in range(16))


def test_negative_control_vectorised_sigmoid_and_silu():
    """torch's sigmoid and silu round an element differently depending on where it sits in
    the tensor, which is why the backend writes silu as x / (1 + exp(-x))."""
    values = random((4096,), 5.0, 10)
    for op in (torch.sigmoid, torch.nn.functional.silu):
        whole = op(values)
        assert not all(same_bytes(whole[i:i + 1], op(values[i:i + 1])) for i in range(4096))


def test_unsupported_device_and_dtype_are_refused():
    with pytest.raises(BackendError, match="'tpu'"):
        TorchBackend(device="tpu")
    with pytest.raises(BackendError, match="'int8'"):
        get_backend("torch", dtype="int8")
    with pytest.raises(BackendError, match="'nope'"):
        get_backend("nope")


@pytest.mark.parametrize("format", ["q2_k", "q3_k"])
def test_block_formats_without_torch_kernels_dequantize_at_load(backend, format):
    """The reference backend (and the Triton and MLX ones, which take the same dense_matrix
    path) holds q2_k / q3_k weights as their exact dequantized values; a block whose bytes
    change gives another matrix (control)."""
    from exactdraft.formats import FORMATS, QuantizedTensor

    row = FORMATS[format]
    rng = np.random.default_rng(31)
    data = rng.integers(0, 256, (4, 2 * row.block_bytes), dtype=np.uint8)
    for offset in {"q2_k": (80, 82), "q3_k": (108,)}[format]:
        for block in (0, row.block_bytes):
            data[:, block + offset:block + offset + 2] = np.frombuffer(
                np.float16(0.01).tobytes(), np.uint8)
    weight = QuantizedTensor(format, data, (4, 512))
    held = backend.matrix(weight)
    assert held.t().contiguous().numpy().tobytes() == weight.dequantize().tobytes()
    data[2, 20] ^= 0x04
    assert backend.matrix(weight).numpy().tobytes() != held.numpy().tobytes()
