"""A Bonsai-shaped checkpoint end to end: a tiny random Qwen3 written as GGUF with its matrices
in tq2_0 (one in tq1_0, one in q1_0), as PrismML's Ternary and 1-bit Bonsai models store Qwen3,
loaded with the blocks kept, run on the C kernels' integer-dot path: drafted generation equals
serial generation (compared row by row through tests/exactness.py, with a negative control),
and the loaded matrices take about the file's bytes, not float32's."""

from __future__ import annotations

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.errors import WeightError
from exactdraft.formats import QuantizedTensor
from exactdraft.formats.ternary_blocks import quantize_q1_0
from exactdraft.kernels import cpu
from tests.exactness import ExactnessCheck
from tests.test_generator import PROMPTS

gguf = pytest.importorskip("gguf")

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM, VOCAB, LAYERS = 256, 512, 4, 2, 64, 128, 2
# The matrices not in tq2_0.
OTHER_FORMATS = {"blk.0.attn_v.weight": "TQ1_0", "blk.1.ffn_down.weight": "Q1_0"}


def qwen3_tensors(rng) -> dict:
    """GGUF name -> float32 array (norms) or (array or blocks, type[, "raw"]) for write_gguf."""
    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(width: int) -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(width)).astype(np.float32)

    tensors = {"token_embd.weight": matrix(VOCAB, HIDDEN), "output_norm.weight": norm(HIDDEN),
               "output.weight": (matrix(VOCAB, HIDDEN), "TQ2_0")}
    shapes = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
              "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM),
              "ffn_gate": (INTERMEDIATE, HIDDEN), "ffn_up": (INTERMEDIATE, HIDDEN),
              "ffn_down": (HIDDEN, INTERMEDIATE)}
    for layer in range(LAYERS):
        prefix = f"blk.{layer}."
        for part, width in (("attn_norm", HIDDEN), ("ffn_norm", HIDDEN),
                            ("attn_q_norm", HEAD_DIM), ("attn_k_norm", HEAD_DIM)):
            tensors[prefix + part + ".weight"] = norm(width)
        for part, shape in shapes.items():
            name = prefix + part + ".weight"
            kind = OTHER_FORMATS.get(name, "TQ2_0")
            weights = matrix(*shape)
            tensors[name] = (quantize_q1_0(weights), kind, "raw") if kind == "Q1_0" \
                else (weights, kind)
    return tensors


@pytest.fixture(scope="module")
def bonsai_path(tmp_path_factory, write_gguf) -> str:
    fields = {f"qwen3.{key}": value for key, value in {
        "block_count": LAYERS, "context_length": 256, "embedding_length": HIDDEN,
        "feed_forward_length": INTERMEDIATE, "attention.head_count": HEADS,
        "attention.head_count_kv": KV_HEADS, "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM, "rope.dimension_count": HEAD_DIM,
        "rope.freq_base": 1000000.0, "attention.layer_norm_rms_epsilon": 1e-6}.items()}
    path = str(tmp_path_factory.mktemp("bonsai") / "tiny-bonsai.gguf")
    return write_gguf(path, "qwen3", fields, qwen3_tensors(np.random.default_rng(0)))


@pytest.fixture(scope="module")
def bonsai_checkpoint(bonsai_path):
    from exactdraft.pretrained import load_checkpoint

    return load_checkpoint(bonsai_path, keep_quantized=True, with_tokenizer=False)


def test_the_file_loads_with_its_blocks_kept(bonsai_path, bonsai_checkpoint):
    formats = {name: tensor.format for name, tensor in bonsai_checkpoint.tensors.items()
               if isinstance(tensor, QuantizedTensor)}
    assert formats["model.layers.0.self_attn.v_proj.weight"] == "tq1_0"
    assert formats["model.layers.1.mlp.down_proj.weight"] == "q1_0"
    assert formats["lm_head.weight"] == "tq2_0"
    assert sorted(set(formats.values())) == ["q1_0", "tq1_0", "tq2_0"]
    assert len(formats) == 1 + 7 * LAYERS
    # The blocks are the file's bytes: gguf's reader sees the same ones.
    reader = gguf.GGUFReader(bonsai_path)
    stored = {t.name: np.asarray(t.data) for t in reader.tensors}
    v_proj = bonsai_checkpoint.tensors["model.layers.0.self_attn.v_proj.weight"]
    assert v_proj.data.tobytes() == stored["blk.0.attn_v.weight"].tobytes()


def _packed_matrices(target) -> list:
    """The C backend's packed weight matrices reachable from a target's model."""
    from exactdraft.backends.torch_cpu import Matrix

    found, seen, todo = [], set(), [target]
    while todo:
        item = todo.pop()
        if id(item) in seen or isinstance(item, (str, bytes, int, float, np.ndarray)):
            continue
        seen.add(id(item))
        if isinstance(item, Matrix):
            found.extend(item.packed)
        elif isinstance(item, dict):
            todo.extend(item.values())
        elif isinstance(item, (list, tuple)):
            todo.extend(item)
        elif hasattr(item, "__dict__") and type(item).__module__.startswith("exactdraft"):
            todo.extend(vars(item).values())
    return found


@pytest.mark.skipif(not cpu.available(), reason=f"CPU kernels: {cpu.unavailable_reason()}")
def test_loaded_matrices_take_about_the_file_bytes(bonsai_checkpoint):
    from exactdraft.pretrained import build_target

    target = build_target(bonsai_checkpoint, "torch")
    packed = _packed_matrices(target)
    blocks = [m for m in packed if m.format in ("tq1_0", "tq2_0", "q1_0")]
    assert {m.layout for m in blocks} == {"dot"}
    assert sorted({m.format for m in blocks}) == ["q1_0", "tq1_0", "tq2_0"]
    in_memory = sum(m.data.nbytes for m in blocks)
    in_file = sum(t.data.nbytes for t in bonsai_checkpoint.tensors.values()
                  if isinstance(t, QuantizedTensor))
    as_float32 = sum(4 * t.shape[0] * t.shape[1] for t in bonsai_checkpoint.tensors.values()
                     if isinstance(t, QuantizedTensor))
    # Every matrix has a multiple of 16 rows: no padded group, the records take the blocks' bytes.
    assert in_memory == in_file
    assert in_memory < as_float32 / 10


def _drafted_runs(target, guard: bool, seeds, temperature: float = 0.8) -> ExactnessCheck:
    serial = xd.Generator(target)
    lookup = xd.Generator(target, xd.PromptLookup(max_draft=5, min_match=1), guard=guard)
    self_drafted = xd.Generator(target, xd.DraftModel(target, max_draft=3), guard=guard)
    check = ExactnessCheck()
    for seed in seeds:
        params = xd.SamplingParams(temperature=temperature, top_p=0.95, seed=seed)
        prompt = PROMPTS[seed % len(PROMPTS)] * 2
        reference = check.serial_run(serial, prompt, 30, params, stop_tokens=[])
        for generator in (lookup, self_drafted):
            check.compare(generator, prompt, 30, params, reference=reference, stop_tokens=[],
                          label=f"{generator.drafter!r} seed {seed}")
    return check


@pytest.mark.skipif(not cpu.available(), reason=f"CPU kernels: {cpu.unavailable_reason()}")
def test_drafted_equals_serial_on_the_integer_dot_path(bonsai_checkpoint):
    from exactdraft.pretrained import build_target

    target = build_target(bonsai_checkpoint, "torch")
    assert target.backend.quantized_activations
    _drafted_runs(target, True, seeds=range(3)).assert_exact()


def test_negative_control_an_inexact_backend_is_caught(bonsai_checkpoint):
    """The same runs on a backend whose multi-row passes are off by ulps (the torch reference
    path, which dequantizes the ternary and 1-bit blocks at load), with the guard off."""
    import torch

    from exactdraft.pretrained import build_target
    from tests.inexact import InexactTorchBackend

    target = build_target(bonsai_checkpoint, InexactTorchBackend(split_k=True))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/conftest.py's inexact_targets
    try:
        check = _drafted_runs(target, False, seeds=range(2))
    finally:
        torch.set_num_threads(threads)
    check.assert_caught(min_fraction=0.5)


def test_a_type_still_not_read_is_refused_naming_the_supported_ones(tmp_path, write_gguf):
    fields = {"llama.block_count": 1, "llama.context_length": 64, "llama.embedding_length": 256,
              "llama.feed_forward_length": 64, "llama.attention.head_count": 2}
    spec = (np.zeros((8, 50), np.uint8), "IQ1_S", "raw")
    path = write_gguf(str(tmp_path / "iq1_s.gguf"), "llama", fields, {"token_embd.weight": spec})
    from exactdraft.pretrained import load_checkpoint

    with pytest.raises(WeightError, match=r"'token_embd.weight' has type IQ1_S.*supported:.*"
                                          r"TQ1_0, TQ2_0, Q1_0"):
        load_checkpoint(path, with_tokenizer=False)
