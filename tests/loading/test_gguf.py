"""GGUF loading: SmolLM2's config, exact dequantization, the q/k un-permutation (proven by logits
and greedy parity with transformers on the same file), tiny llama/qwen2/qwen3 files against
transformers' own modeling code, and clear errors for files we cannot use."""

from __future__ import annotations

import math
import os
import re
import shutil
import sys

import numpy as np
import pytest

from exactdraft.errors import CheckpointError, ConfigError, GGUFError, TokenizerError, WeightError
from exactdraft.formats import QuantizedTensor
from exactdraft.loading.gguf import read_gguf_metadata
from exactdraft.models.families.llama import rope_row_order
from tests.loading.conftest import load_gguf

gguf = pytest.importorskip("gguf")

LAYER_PARTS = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
GLOBALS = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_name(hf_name: str) -> str:
    if hf_name in GLOBALS:
        return GLOBALS[hf_name]
    index, part, kind = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)",
                                     hf_name).groups()
    return f"blk.{index}.{LAYER_PARTS[part]}.{kind}"


def converter_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: Hugging Face q/k rows -> the interleaved-rope order it stores."""
    return (rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


def converter_unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    return (rows.reshape(heads, rows.shape[0] // heads // 2, 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# -- the real checkpoint ------------------------------------------------------------------------


def test_smollm2_config_and_metadata(smollm_checkpoint):
    c = smollm_checkpoint.config
    assert (c.model_type, c.vocab_size, c.hidden_size, c.intermediate_size) == (
        "llama", 49152, 576, 1536)
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (30, 9, 3, 64)
    assert c.rope_theta == 100000.0 and c.rope_scaling is None
    assert np.float32(c.rms_norm_eps) == np.float32(1e-5)
    assert c.max_position_embeddings == 8192
    assert c.tie_word_embeddings and "lm_head.weight" not in smollm_checkpoint.tensors
    assert not (c.attention_bias or c.attention_output_bias or c.mlp_bias or c.qk_norm)
    assert c.sliding_windows == (0,) * 30
    assert (c.bos_token_id, c.eos_token_ids) == (1, (2,))
    meta = smollm_checkpoint.metadata
    assert meta["architecture"] == "llama" and meta["file_type"] == 3  # MOSTLY_Q4_1
    assert meta["tensor_types"] == {"Q8_0": 1, "Q4_1": 210, "F32": 61}
    assert (meta["tokenizer_model"], meta["tokenizer_pre"]) == ("gpt2", "smollm")
    assert len(smollm_checkpoint.tensors) == 272
    assert smollm_checkpoint.tokenizer is not None
    assert read_gguf_metadata(meta["path"])["llama.block_count"] == 30


def test_every_tensor_equals_gguf_dequantize_bit_for_bit(smollm_path, smollm_checkpoint):
    config = smollm_checkpoint.config
    reader = gguf.GGUFReader(smollm_path)
    permuted_differs = False
    for entry in reader.tensors:
        shape = tuple(int(d) for d in reversed(entry.shape.tolist()))
        if entry.tensor_type == gguf.GGMLQuantizationType.F32:
            expected = np.asarray(entry.data, dtype=np.float32).reshape(shape)
        else:
            expected = gguf.quants.dequantize(entry.data, entry.tensor_type).reshape(shape)
        stored = expected
        if ".attn_q." in entry.name:
            expected = converter_unpermute(expected, config.num_heads)
        elif ".attn_k." in entry.name:
            expected = converter_unpermute(expected, config.num_kv_heads)
        name = next(k for k in smollm_checkpoint.tensors if gguf_name(k) == entry.name)
        ours = smollm_checkpoint.tensors[name]
        assert ours.dtype == np.float32, name
        assert same_bits(ours, expected), name
        permuted_differs |= expected is not stored and not same_bits(ours, stored)
    # Control: the rows the file stores are really in another order than Hugging Face's.
    assert permuted_differs


def test_keep_quantized_keeps_the_file_blocks(smollm_path, smollm_checkpoint):
    """Kept matrices hold the file's own blocks (rows of q and k in Hugging Face's order), and
    their dequantization equals the gguf package's dequantization of those blocks, bit for
    bit: an independent decoder, not the library's own."""
    config = smollm_checkpoint.config
    reader = gguf.GGUFReader(smollm_path)
    stored = {entry.name: entry for entry in reader.tensors}
    kept = load_gguf(smollm_path, keep_quantized=True)
    formats = {}
    for name, value in kept.tensors.items():
        entry = stored[gguf_name(name)]
        if not isinstance(value, QuantizedTensor):
            assert value.ndim == 1 and same_bits(value, np.asarray(entry.data, np.float32)), name
            continue
        formats[value.format] = formats.get(value.format, 0) + 1
        assert value.format == entry.tensor_type.name.lower(), name
        blocks = np.asarray(entry.data, np.uint8).reshape(value.data.shape)
        if ".attn_q." in entry.name or ".attn_k." in entry.name:
            heads = config.num_heads if ".attn_q." in entry.name else config.num_kv_heads
            blocks = converter_unpermute(blocks, heads)
        assert np.array_equal(value.data, blocks), name
        theirs = gguf.quants.dequantize(value.data, entry.tensor_type).reshape(value.shape)
        assert same_bits(value.dequantize(), theirs), name
    assert formats == {"q8_0": 1, "q4_1": 210}


@pytest.mark.parametrize("heads, head_dim", [(1, 2), (3, 8), (9, 64), (2, 128)])
def test_rope_row_order_undoes_the_converter(heads, head_dim):
    rows = np.random.default_rng(0).standard_normal((heads * head_dim, 5)).astype(np.float32)
    order = rope_row_order(heads, head_dim)
    assert np.array_equal(converter_permute(rows, heads)[order], rows)
    if head_dim > 2:  # control: the converter really moves rows
        assert not np.array_equal(converter_permute(rows, heads), rows)


# -- parity with transformers on the real checkpoint ------------------------------------------


@pytest.fixture(scope="module")
def hf_model(smollm_path):
    transformers = pytest.importorskip("transformers")
    import torch

    folder, file = os.path.split(smollm_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=file, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def our_model(smollm_checkpoint):
    from exactdraft.backends.registry import get_backend
    from exactdraft.models.families.llama import build as build_llama

    return build_llama(smollm_checkpoint.config, smollm_checkpoint.tensors, get_backend("torch"))


def parity_prompts(tokenizer) -> list[list[int]]:
    chat = tokenizer.render_chat([{"role": "user", "content": "Write a haiku about the sea."}])
    return [tokenizer.encode(text) for text in (
        "The capital of France is",
        chat,
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
        "Les chats et les chiens 🐱🐶 sont 猫 et 犬 en chinois. 12345 + 678 =",
    )]


def hf_last_logits(hf_model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0, -1].numpy()


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smollm_checkpoint, our_model, hf_model):
    from exactdraft.backends.registry import get_backend
    from exactdraft.models.families.llama import build as build_llama

    prompts = parity_prompts(smollm_checkpoint.tokenizer)
    relative = []
    for ids in prompts:
        ours = our_model.forward(our_model.new_state(), ids, rows="last")[-1]
        reference = hf_last_logits(hf_model, ids)
        relative.append(np.abs(ours - reference).max() / np.abs(reference).max())
        assert ours.argmax() == reference.argmax()
    print(f"max |ours - transformers| / max |logit| per prompt: {relative}")
    assert max(relative) < 1e-4
    # Control: the same weights with q/k left in the file's interleaved order are far off.
    config = smollm_checkpoint.config
    raw = dict(smollm_checkpoint.tensors)
    for name in raw:
        for part, heads in (("q_proj", config.num_heads), ("k_proj", config.num_kv_heads)):
            if name.endswith(f"self_attn.{part}.weight"):
                raw[name] = converter_permute(raw[name], heads)
    wrong = build_llama(config, raw, get_backend("torch"))
    ids = prompts[1]
    off = wrong.forward(wrong.new_state(), ids, rows="last")[-1] - hf_last_logits(hf_model, ids)
    assert np.abs(off).max() / 25.0 > 1e-2


@pytest.mark.slow
def test_smollm2_greedy_continuation_matches_transformers(smollm_checkpoint, our_model, hf_model):
    import torch

    stops = set(smollm_checkpoint.config.eos_token_ids)
    for ids in parity_prompts(smollm_checkpoint.tokenizer)[1:3]:
        state = our_model.new_state()
        logits = our_model.forward(state, ids, rows="last")
        ours: list[int] = []
        while len(ours) < 32:
            token = int(logits[-1].argmax())
            ours.append(token)
            if token in stops:
                break
            logits = our_model.forward(state, [token], rows="last")
        with torch.no_grad():
            generated = hf_model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=32, do_sample=False, eos_token_id=sorted(stops),
                pad_token_id=sorted(stops)[0])
        assert ours == generated[0, len(ids):].tolist()


# -- tiny files of every family against transformers' modeling code ---------------------------

FORMATS_2D = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "F32")


def stored_values(weights: np.ndarray, kind: str) -> np.ndarray:
    """What a file of this format gives back, computed with gguf's own quantizer."""
    if kind == "F32":
        return weights
    if kind == "F16":
        return weights.astype(np.float16).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    return gguf.quants.dequantize(gguf.quants.quantize(weights, qtype), qtype)


def tiny_hf_model(family: str):
    transformers = pytest.importorskip("transformers")
    import torch

    torch.manual_seed(0)
    common = dict(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-5)
    if family == "llama":
        config = transformers.LlamaConfig(**common, tie_word_embeddings=False,
                                          rope_parameters={"rope_type": "default",
                                                           "rope_theta": 10000.0})
        model = transformers.LlamaForCausalLM(config)
    elif family == "llama3-rope":
        config = transformers.LlamaConfig(**common, tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
        model = transformers.LlamaForCausalLM(config)
    elif family == "qwen2":
        config = transformers.Qwen2Config(**common, tie_word_embeddings=True,
                                          rope_parameters={"rope_type": "default",
                                                           "rope_theta": 1000000.0})
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.Qwen3Config(**common, head_dim=32, tie_word_embeddings=False,
                                          rope_parameters={"rope_type": "default",
                                                           "rope_theta": 1000000.0})
        model = transformers.Qwen3ForCausalLM(config)
    with torch.no_grad():  # norms start at 1; make them matter
        for param in model.parameters():
            if param.ndim == 1:
                param.copy_(1 + 0.1 * torch.randn_like(param))
    return model.eval()


def llama3_rope_factors(config) -> np.ndarray:
    """llama.cpp's converter: one factor per rotary frequency for rope_type llama3."""
    rope = config.rope_parameters
    head_dim = config.hidden_size // config.num_attention_heads
    base = rope["rope_theta"] ** (np.arange(0, head_dim, 2) / head_dim)
    old, low, high = (rope["original_max_position_embeddings"], rope["low_freq_factor"],
                      rope["high_freq_factor"])
    factors = []
    for wavelen in 2 * math.pi * base:
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(rope["factor"])
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / rope["factor"] + smooth))
    return np.asarray(factors, dtype=np.float32)


@pytest.mark.parametrize("family", ["llama", "llama3-rope", "qwen2", "qwen3"])
def test_tiny_family_file_matches_transformers(tmp_path, write_gguf, family):
    import torch

    from exactdraft.backends.registry import get_backend
    from exactdraft.models.families.llama import build as build_llama

    model = tiny_hf_model(family)
    hf = model.config
    arch = "llama" if family.startswith("llama") else family
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    fields = {f"{arch}.{k}": v for k, v in {
        "block_count": hf.num_hidden_layers, "context_length": hf.max_position_embeddings,
        "embedding_length": hf.hidden_size, "feed_forward_length": hf.intermediate_size,
        "attention.head_count": hf.num_attention_heads,
        "attention.head_count_kv": hf.num_key_value_heads,
        "attention.key_length": head_dim, "attention.value_length": head_dim,
        "rope.dimension_count": head_dim, "rope.freq_base": hf.rope_parameters["rope_theta"],
        "attention.layer_norm_rms_epsilon": hf.rms_norm_eps}.items()}
    tensors, expected = {}, {}
    state = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    if hf.tie_word_embeddings:
        state.pop("lm_head.weight")
    for index, (name, weights) in enumerate(sorted(state.items())):
        kind = FORMATS_2D[index % len(FORMATS_2D)] if weights.ndim == 2 else "F32"
        # Rows are quantized independently, so permuting them commutes with quantizing.
        expected[name] = stored_values(weights, kind)
        stored = weights
        if arch == "llama" and ".q_proj." in name:
            stored = converter_permute(weights, hf.num_attention_heads)
        elif arch == "llama" and ".k_proj." in name:
            stored = converter_permute(weights, hf.num_key_value_heads)
        tensors[gguf_name(name)] = stored if kind == "F32" else (stored, kind)
    if family == "llama3-rope":
        tensors["rope_freqs.weight"] = llama3_rope_factors(hf)
    path = write_gguf(str(tmp_path / f"{family}.gguf"), arch, fields, tensors)

    checkpoint = load_gguf(path)
    config = checkpoint.config
    assert checkpoint.tokenizer is None
    assert (config.model_type, config.vocab_size, config.head_dim) == (arch, 100, head_dim)
    assert config.tie_word_embeddings == hf.tie_word_embeddings
    assert config.attention_bias == (family == "qwen2") and config.qk_norm == (family == "qwen3")
    assert set(checkpoint.tensors) == set(expected)
    for name, values in expected.items():
        assert same_bits(checkpoint.tensors[name], values), name
    if family == "llama3-rope":
        from exactdraft.models.blocks import rope_frequencies

        assert config.rope_scaling is not None and config.rope_scaling.rope_type == "llama3"
        np.testing.assert_allclose(rope_frequencies(config.head_dim, config.rope_theta,
                                                    config.rope_scaling),
                                   model.model.rotary_emb.inv_freq.numpy(), rtol=1e-6)

    model.load_state_dict({k: torch.from_numpy(v) for k, v in expected.items()}, strict=False)
    ids = [3, 17, 42, 99, 0, 8, 64, 5, 23, 71, 12, 40]
    ours_model = build_llama(config, checkpoint.tensors, get_backend("torch"))
    ours = ours_model.forward(ours_model.new_state(), ids, rows="all")
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(ours - reference).max() <= 1e-5 * max(1.0, np.abs(reference).max())


# -- files we cannot use --------------------------------------------------------------------


def tiny_llama_fields() -> dict:
    return {"llama.block_count": 1, "llama.context_length": 64, "llama.embedding_length": 32,
            "llama.feed_forward_length": 64, "llama.attention.head_count": 2}


def test_unsupported_architecture_is_named(tmp_path, write_gguf):
    fields = {"phi3.block_count": 1, "phi3.embedding_length": 32}
    path = write_gguf(str(tmp_path / "phi.gguf"), "phi3", fields,
                      {"token_embd.weight": np.zeros((8, 32), np.float32)})
    with pytest.raises(ConfigError, match=r"'phi3'.*supported:.*llama, .*qwen2, qwen3, .*qwen3moe"):
        load_gguf(path)


@pytest.mark.parametrize("kind", ["Q8_1", "IQ2_XXS", "Q8_K"])
def test_unsupported_tensor_type_is_named(tmp_path, write_gguf, kind):
    block_size, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    spec = (np.zeros((8, block_bytes), np.uint8), kind, "raw")
    fields = tiny_llama_fields() | {"llama.embedding_length": block_size}
    path = write_gguf(str(tmp_path / f"{kind}.gguf"), "llama", fields,
                      {"token_embd.weight": spec})
    with pytest.raises(WeightError, match=rf"'token_embd.weight' has type {kind}.*Q4_1"):
        load_gguf(path)


def test_unknown_tensor_name_is_named(tmp_path, write_gguf):
    path = write_gguf(str(tmp_path / "moe.gguf"), "llama", tiny_llama_fields(), {
        "token_embd.weight": np.zeros((8, 32), np.float32),
        "blk.0.ffn_gate_exps.weight": np.zeros((4, 64, 32), np.float32)})
    with pytest.raises(WeightError, match="blk.0.ffn_gate_exps.weight"):
        load_gguf(path)


def test_unsupported_tokenizer_names_the_way_out(tmp_path, write_gguf):
    fields = tiny_llama_fields() | {"tokenizer.ggml.model": "bert",
                                    "tokenizer.ggml.tokens": [f"t{i}" for i in range(8)]}
    path = write_gguf(str(tmp_path / "wordpiece.gguf"), "llama", fields, {
        "token_embd.weight": np.zeros((8, 32), np.float32)})
    with pytest.raises(TokenizerError, match=r"'bert'.*with_tokenizer=False"):
        load_gguf(path)
    assert load_gguf(path, with_tokenizer=False).tokenizer is None


@pytest.mark.parametrize("keep", [4, 20, 1_000_000, -4096])
def test_truncated_file_names_the_file(tmp_path, smollm_path, keep):
    path = str(tmp_path / "cut.gguf")
    shutil.copyfile(smollm_path, path)
    os.truncate(path, keep if keep > 0 else os.path.getsize(path) + keep)
    with pytest.raises(GGUFError, match=re.escape(path)):
        load_gguf(path)


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(GGUFError, match="not a GGUF file"):
        load_gguf(path)
    with pytest.raises(CheckpointError, match="missing.gguf"):
        load_gguf(tmp_path / "missing.gguf")


def test_gguf_files_load_without_the_gguf_package(monkeypatch, smollm_path):
    monkeypatch.setitem(sys.modules, "gguf", None)
    checkpoint = load_gguf(smollm_path)
    assert checkpoint.config.num_layers == 30 and checkpoint.tokenizer is not None
