"""Block-scaled FP8 safetensors checkpoints (DeepSeek-V3's format) load as float32 weights equal
to float32(e4m3fn code) * float32(block scale), one rounding each.

The checkpoints are written here: a tiny deepseek_v3 model built by transformers, every Linear
weight of its layers converted to float8_e4m3fn with one float32 `weight_scale_inv` per block
(the block's largest magnitude over 448, as DeepSeek's own conversion scales them), and
`quantization_config` {quant_method: fp8, weight_block_size}. Blocks of 16x16 leave edge blocks
in every matrix of the tiny model (28, 50, 110 rows or columns); blocks of 128x128 make each
matrix one edge block, the layout transformers' CPU dequantization also reads.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from exactdraft.errors import CheckpointError, WeightError
from exactdraft.guard import probe_tokens
from exactdraft.loading.folder import read_folder
from exactdraft.loading.fp8_blocks import dequantize_blocks, e4m3fn_values

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _blockwise_reference(codes: np.ndarray, scales: np.ndarray, block) -> np.ndarray:
    """The format written out: each block's decoded codes times its scale, block by block."""
    values = torch.from_numpy(codes.copy()).view(torch.float8_e4m3fn).float().numpy()
    out = np.empty(codes.shape, np.float32)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            rows = slice(i * block[0], (i + 1) * block[0])
            columns = slice(j * block[1], (j + 1) * block[1])
            out[rows, columns] = values[rows, columns] * np.float32(scales[i, j])
    return out


def _quantize(weight, block):
    """float8_e4m3fn codes and float32 block scales of a float32 matrix."""
    rows, columns = weight.shape
    scales = torch.empty(-(-rows // block[0]), -(-columns // block[1]))
    codes = torch.empty(rows, columns, dtype=torch.float8_e4m3fn)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            part = (slice(i * block[0], (i + 1) * block[0]),
                    slice(j * block[1], (j + 1) * block[1]))
            scales[i, j] = weight[part].abs().max() / 448.0
            codes[part] = (weight[part] / scales[i, j]).to(torch.float8_e4m3fn)
    return codes, scales


def _is_linear(name: str, tensor) -> bool:
    return name.startswith("model.layers.") and name.endswith("_proj.weight") and tensor.ndim == 2


def _write_folder(source: str, folder: str, state: dict, config_changes: dict) -> str:
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(source):
        if name != "model.safetensors":
            shutil.copy(os.path.join(source, name), folder)
    safetensors_torch.save_file(state, os.path.join(folder, "model.safetensors"),
                                metadata={"format": "pt"})
    with open(os.path.join(source, "config.json")) as handle:
        config = json.load(handle)
    config.update(config_changes)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle)
    return folder


def fp8_checkpoint(source: str, folder: str, block) -> tuple[str, str]:
    """The fp8 folder of `source`, and the float32 folder holding its dequantized weights
    (each block's codes times its scale, computed here block by block)."""
    state = safetensors_torch.load_file(os.path.join(source, "model.safetensors"))
    stored, dequantized = {}, {}
    for name, tensor in state.items():
        if _is_linear(name, tensor):
            codes, scales = _quantize(tensor, block)
            stored[name], stored[name + "_scale_inv"] = codes, scales
            dequantized[name] = torch.from_numpy(_blockwise_reference(
                codes.view(torch.uint8).numpy(), scales.numpy(), block))
        else:
            stored[name] = dequantized[name] = tensor
    quantization = {"quantization_config": {
        "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
        "weight_block_size": list(block)}}
    return (_write_folder(source, folder + "_fp8", stored, quantization),
            _write_folder(source, folder + "_dequantized", dequantized, {}))


@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory) -> str:
    from tests.models.families.test_deepseek_v3 import DEEPSEEK_V3, build_checkpoint

    return build_checkpoint(str(tmp_path_factory.mktemp("deepseek_v3_float")), DEEPSEEK_V3)


def _logits(folder: str) -> np.ndarray:
    from exactdraft.pretrained import build_target, load_checkpoint

    target = build_target(load_checkpoint(folder), "torch")
    tokens = probe_tokens(24, target.vocab_size, salt=5)
    return np.asarray(target.forward(target.new_state(), tokens, rows="all"), np.float32)


# -- the codes and the blocks ----------------------------------------------------------------

def test_every_e4m3fn_code_decodes_exactly():
    ours = e4m3fn_values()
    reference = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    nan = np.isnan(reference)
    assert np.flatnonzero(nan).tolist() == [0x7F, 0xFF] and np.isnan(ours[nan]).all()
    assert ours[~nan].tobytes() == reference[~nan].tobytes()  # -0.0 at 0x80 included
    assert (ours[0x01], ours[0x08], ours[0x38], ours[0x7E]) == (2.0 ** -9, 2.0 ** -6, 1.0, 448.0)
    # Negative control: reading exponent 15 as IEEE infinities/NaN (e4m3 without the fn
    # extension) loses the top eight codes of each sign, so the comparison above would fail.
    ieee = ours.copy()
    ieee[[*range(0x78, 0x7F), *range(0xF8, 0xFF)]] = np.inf
    assert ieee[~nan].tobytes() != reference[~nan].tobytes()


@pytest.mark.parametrize("shape,block", [((300, 200), (128, 128)), ((256, 384), (128, 128)),
                                         ((2, 45, 37), (16, 8))])
def test_blocks_dequantize_with_one_float32_multiply(shape, block):
    generator = torch.Generator().manual_seed(sum(shape))
    weight = torch.randn(shape, generator=generator) * 0.05
    codes, scales = zip(*(_quantize(matrix, block) for matrix in weight.reshape(-1, *shape[-2:])))
    codes = torch.stack(codes).reshape(shape).view(torch.uint8).numpy()
    scales = torch.stack(scales).reshape(*shape[:-2], *scales[0].shape).numpy()
    ours = dequantize_blocks(codes, scales, block)
    matrices = zip(codes.reshape(-1, *shape[-2:]), scales.reshape(-1, *scales.shape[-2:]))
    reference = np.stack([_blockwise_reference(c, s, block) for c, s in matrices])
    assert ours.dtype == np.float32 and ours.tobytes() == reference.reshape(shape).tobytes()
    # Negative control: the same product rounded to bfloat16 (transformers' result when the
    # model's dtype is bfloat16) is another set of bits.
    rounded = torch.from_numpy(reference).to(torch.bfloat16).float().numpy()
    assert rounded.tobytes() != reference.tobytes()


def test_transformers_dequantizes_divisible_blocks_to_the_same_bits():
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    weight = torch.randn(256, 384, generator=torch.Generator().manual_seed(7)) * 0.05
    codes, scales = _quantize(weight, (128, 128))
    theirs = Fp8Dequantize(None)._dequantize_one(codes, scales, output_dtype=torch.float32)
    ours = dequantize_blocks(codes.view(torch.uint8).numpy(), scales.numpy(), (128, 128))
    assert ours.tobytes() == theirs.numpy().tobytes()


# -- whole checkpoints -----------------------------------------------------------------------

@pytest.mark.parametrize("block", [(16, 16), (128, 128)])
def test_fp8_checkpoint_gives_the_logits_of_its_dequantized_weights(float_checkpoint, tmp_path,
                                                                    block):
    fp8, dequantized = fp8_checkpoint(float_checkpoint, str(tmp_path / "model"), block)
    files = read_folder(fp8)
    assert not any(name.endswith("_scale_inv") for name in files.tensors)
    reference = read_folder(dequantized).tensors
    name = "model.layers.0.self_attn.kv_b_proj.weight"  # 110x20: edge blocks in both dims
    assert files.tensors[name].tobytes() == reference[name].tobytes()
    ours = _logits(fp8)
    assert ours.tobytes() == _logits(dequantized).tobytes()
    # Negative control: the float model before quantization gives other logits, so the
    # equality above is about the dequantized values.
    assert ours.tobytes() != _logits(float_checkpoint).tobytes()


def test_transformers_loads_the_fp8_checkpoint_to_the_same_weights(float_checkpoint, tmp_path):
    transformers = pytest.importorskip("transformers")
    fp8, dequantized = fp8_checkpoint(float_checkpoint, str(tmp_path / "model"), (128, 128))
    config = transformers.FineGrainedFP8Config(dequantize=True, weight_block_size=(128, 128))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        fp8, dtype=torch.float32, quantization_config=config).state_dict()
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        dequantized, dtype=torch.float32).state_dict()
    assert theirs.keys() == reference.keys()
    for name, value in reference.items():
        assert theirs[name].numpy().tobytes() == value.numpy().tobytes(), name
    original = transformers.AutoModelForCausalLM.from_pretrained(
        float_checkpoint, dtype=torch.float32).state_dict()
    different = [name for name in original if not torch.equal(original[name], theirs[name])]
    assert "model.layers.0.self_attn.kv_b_proj.weight" in different  # negative control


# -- refusals --------------------------------------------------------------------------------

def _edited(float_checkpoint, tmp_path, edit, config=None) -> str:
    fp8, _ = fp8_checkpoint(float_checkpoint, str(tmp_path / "model"), (16, 16))
    path = os.path.join(fp8, "model.safetensors")
    state = safetensors_torch.load_file(path)
    edit(state)
    safetensors_torch.save_file(state, path)
    if config is not None:
        with open(os.path.join(fp8, "config.json")) as handle:
            raw = json.load(handle)
        raw["quantization_config"] = config
        with open(os.path.join(fp8, "config.json"), "w") as handle:
            json.dump(raw, handle)
    return fp8


NAME = "model.layers.0.self_attn.o_proj.weight"  # 64x50


def _set_nan(state):
    state[NAME].view(torch.uint8)[3, 7] = 0x7F


@pytest.mark.parametrize("edit,message", [
    (lambda s: s.pop(NAME + "_scale_inv"), f"fp8 tensor '{NAME}' has no '{NAME}_scale_inv'"),
    (lambda s: s.update({NAME + "_scale_inv": torch.ones(4, 3)}),
     rf"tensor '{NAME}_scale_inv' has shape \(4, 3\); '{NAME}' of shape \(64, 50\) needs "
     r"\(4, 4\) for blocks of 16x16"),
    (lambda s: s.update({NAME: s[NAME].float().to(torch.float8_e5m2)}),
     f"tensor '{NAME}_scale_inv' scales '{NAME}', which is F8_E5M2, not F8_E4M3"),
    (lambda s: s.update({"model.layers.0.mlp.extra": torch.zeros(4, dtype=torch.float8_e5m2)}),
     "tensor 'model.layers.0.mlp.extra' is stored as F8_E5M2, which is not read"),
    (lambda s: s.update({"extra": torch.ones(8).to(torch.float8_e4m3fn),
                         "extra_scale_inv": torch.tensor(1.0)}),
     r"fp8 tensor 'extra' of shape \(8,\) has fewer than two dimensions"),
    (lambda s: s.update({NAME + "_scale_inv": s[NAME + "_scale_inv"].to(torch.int32)}),
     f"tensor '{NAME}_scale_inv' is stored as I32; a block scale is one of F32, BF16, F16"),
])
def test_bad_fp8_tensors_are_refused_by_name_at_open(float_checkpoint, tmp_path, edit, message):
    folder = _edited(float_checkpoint, tmp_path, edit)
    with pytest.raises(WeightError, match=message) as refused:
        read_folder(folder)
    assert str(refused.value).startswith(os.path.join(folder, "model.safetensors") + ": ")


def test_the_nan_code_is_refused_by_tensor_and_position(float_checkpoint, tmp_path):
    files = read_folder(_edited(float_checkpoint, tmp_path, _set_nan))
    with pytest.raises(WeightError, match=rf"tensor '{NAME}' holds the fp8 NaN code at \(3, 7\)"):
        files.tensors[NAME]


def test_a_scale_that_is_not_finite_is_refused_when_read(float_checkpoint, tmp_path):
    def edit(state):
        state[NAME + "_scale_inv"][1, 2] = float("inf")

    files = read_folder(_edited(float_checkpoint, tmp_path, edit))
    with pytest.raises(WeightError, match=rf"tensor '{NAME}_scale_inv' holds inf at \(1, 2\)"):
        files.tensors[NAME]
    files.tensors["model.layers.0.self_attn.kv_b_proj.weight"]  # other weights still read


def test_fp8_without_its_quantization_config_is_refused(float_checkpoint, tmp_path):
    fp8 = _edited(float_checkpoint, tmp_path, lambda s: None, config={})
    with pytest.raises(WeightError, match=f"tensor '{NAME}' is stored as F8_E4M3, read only"):
        read_folder(fp8).tensors[NAME]


@pytest.mark.parametrize("config,message", [
    ({"quant_method": "fp8"}, "weight_block_size must be two positive integers"),
    ({"quant_method": "fp8", "weight_block_size": [128, 0]}, r"got \[128, 0\]"),
    ({"quant_method": "fp8", "weight_block_size": [16, 16], "activation_scheme": "static"},
     "activation_scheme 'static' is not read"),
])
def test_bad_fp8_settings_are_refused_by_key(float_checkpoint, tmp_path, config, message):
    with pytest.raises(CheckpointError, match=message):
        read_folder(_edited(float_checkpoint, tmp_path, lambda s: None, config=config))


def test_block_sizes_far_larger_than_the_weight_take_no_memory_of_their_size():
    """A checkpoint may declare any block size: the scales are indexed per element, never
    repeated out to the block size (2**35 columns would take 128 GiB), and the values equal
    those of the block size cut to the weight."""
    from exactdraft.loading.fp8_blocks import fp8_e4m3_matrix

    rng = np.random.default_rng(3)
    codes = rng.integers(0, 0x7E, (4, 64), dtype=np.uint8)
    scales = np.float32([[0.5]])
    for block in ((1 << 33, 64), (4, 1 << 35)):
        values = dequantize_blocks(codes, scales, block)
        assert values.tobytes() == dequantize_blocks(codes, scales, (4, 64)).tobytes()
        held = fp8_e4m3_matrix(codes, scales, block)
        assert held.dequantize().tobytes() == values.tobytes()
    # Negative control: another scale gives other bytes.
    assert dequantize_blocks(codes, np.float32([[0.25]]), (4, 64)).tobytes() != values.tobytes()
