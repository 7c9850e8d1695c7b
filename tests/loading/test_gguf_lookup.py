"""GGUF files with iq4_nl, iq4_xs and mxfp4 tensors: a tiny llama file written with gguf-py
loads with its blocks kept as stored (or dequantized bit for bit as gguf-py does), and runs on
the torch CPU backend's integer-dot kernels close to the float64 reference on the same values;
every other backend dequantizes these formats at load."""

from __future__ import annotations

import numpy as np
import pytest

from exactdraft.formats import FORMATS, QuantizedTensor
from tests.loading.conftest import load_gguf
from tests.loading.test_gguf import gguf_name

gguf = pytest.importorskip("gguf")

WIDTH = 256  # a multiple of iq4_xs's 256-weight block
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def stored_blocks(kind: str, rows: int, rng) -> np.ndarray:
    """Blocks of [rows, WIDTH] weights: gguf's mxfp4 quantization of small normal weights, or
    random iq4 codes with a small float16 d (gguf-py has no iq4 quantizer)."""
    if kind == "MXFP4":
        weights = (0.05 * rng.standard_normal((rows, WIDTH))).astype(np.float32)
        return gguf.quants.quantize(weights, gguf.GGMLQuantizationType.MXFP4)
    row = FORMATS[kind.lower()]
    blocks = rng.integers(0, 256, (rows * WIDTH // row.block_size, row.block_bytes), np.uint8)
    d = 4e-4 if kind == "IQ4_NL" else 2e-5
    blocks[:, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def tiny_file(tmp_path, write_gguf, kind: str) -> tuple[str, dict[str, np.ndarray]]:
    """A one-layer llama GGUF whose matrices are stored as `kind`; returns it and the blocks."""
    rng = np.random.default_rng(0)
    fields = {"llama.block_count": 1, "llama.context_length": 64,
              "llama.embedding_length": WIDTH, "llama.feed_forward_length": WIDTH,
              "llama.attention.head_count": 2, "llama.attention.head_count_kv": 2}
    blocks = {f"blk.0.{name}.weight": stored_blocks(kind, WIDTH, rng) for name in MATRICES}
    tensors = {name: (data, kind, "raw") for name, data in blocks.items()}
    tensors |= {"token_embd.weight": rng.standard_normal((50, WIDTH)).astype(np.float32),
                "blk.0.attn_norm.weight": np.ones(WIDTH, np.float32),
                "blk.0.ffn_norm.weight": np.ones(WIDTH, np.float32),
                "output_norm.weight": np.ones(WIDTH, np.float32)}
    return write_gguf(str(tmp_path / f"{kind}.gguf"), "llama", fields, tensors), blocks


@pytest.mark.parametrize("kind", ["IQ4_NL", "IQ4_XS", "MXFP4"])
def test_lookup_tensors_load_as_stored_and_as_gguf_dequantizes(tmp_path, write_gguf, kind):
    path, blocks = tiny_file(tmp_path, write_gguf, kind)
    kept = load_gguf(path, keep_quantized=True, with_tokenizer=False)
    dense = load_gguf(path, with_tokenizer=False)
    qtype = gguf.GGMLQuantizationType[kind]
    matrices = {name: value for name, value in kept.tensors.items()
                if isinstance(value, QuantizedTensor)}
    assert {gguf_name(name) for name in matrices} == set(blocks)
    for name, weight in matrices.items():
        assert weight.format == kind.lower() and weight.shape == (WIDTH, WIDTH), name
        # q and k rows come back in rope order: the same rows, each as stored.
        assert sorted(map(bytes, weight.data)) == sorted(map(bytes, blocks[gguf_name(name)]))
        expected = gguf.quants.dequantize(weight.data, qtype)
        assert np.asarray(dense.tensors[name], np.float32).tobytes() == expected.tobytes()


@pytest.mark.parametrize("kind", ["IQ4_NL", "IQ4_XS", "MXFP4"])
def test_a_lookup_file_runs_on_the_integer_dot_kernels(tmp_path, write_gguf, kind):
    """The torch CPU backend multiplies the kept blocks with int8 activations: logits within
    the activation rounding of the padded torch backend's float32 run on the dequantized
    weights, and not its bits (the two paths are different arithmetic)."""
    from exactdraft.backends.registry import get_backend
    from exactdraft.backends.torch_cpu import TorchCPUBackend
    from exactdraft.kernels import cpu
    from exactdraft.models.families.llama import build as build_llama

    if not cpu.available():
        pytest.skip(f"CPU kernels unavailable: {cpu.unavailable_reason()}")
    path, _ = tiny_file(tmp_path, write_gguf, kind)
    kept = load_gguf(path, keep_quantized=True, with_tokenizer=False)
    ids = [3, 17, 42, 9, 0, 8]
    dot_model = build_llama(kept.config, kept.tensors, TorchCPUBackend())
    reference_model = build_llama(kept.config, kept.tensors, get_backend("torch-padded"))
    ours = dot_model.forward(dot_model.new_state(), ids, rows="all")
    reference = reference_model.forward(reference_model.new_state(), ids, rows="all")
    ours, reference = np.asarray(ours, np.float32), np.asarray(reference, np.float32)
    assert np.isfinite(ours).all() and np.abs(reference).max() > 0
    assert np.abs(ours - reference).max() <= 3e-2 * np.abs(reference).max()
    assert ours.tobytes() != reference.tobytes()


def test_a_type_still_not_read_is_refused_with_the_lookup_formats_listed(tmp_path, write_gguf):
    from exactdraft.errors import WeightError

    block_size, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.IQ2_XXS]
    fields = {"llama.block_count": 1, "llama.context_length": 64,
              "llama.embedding_length": block_size, "llama.feed_forward_length": 64,
              "llama.attention.head_count": 2}
    path = write_gguf(str(tmp_path / "iq2.gguf"), "llama", fields, {
        "token_embd.weight": (np.zeros((8, block_bytes), np.uint8), "IQ2_XXS", "raw")})
    with pytest.raises(WeightError, match=r"has type IQ2_XXS, which is not supported") as error:
        load_gguf(path)
    supported = str(error.value).split("supported: ")[-1].split(", ")
    assert {"IQ4_NL", "IQ4_XS", "MXFP4", "Q4_1"} <= set(supported)
