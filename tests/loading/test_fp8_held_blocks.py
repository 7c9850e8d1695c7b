"""Block-scaled FP8 checkpoints held in their codes (keep_quantized, the default): the matrices
that fit stay as fp8_e4m3 blocks, about the file's bytes, and the model's outputs are the bytes
of the float32 path's (keep_quantized=False), drafted equal to serial.

Checkpoints are written as in tests/loading/test_fp8_blocks.py: a tiny qwen3 (every matrix
has columns a multiple of 32, so every fp8 matrix is held in blocks) and the tiny deepseek_v3
(columns of 50, 24 and 20 as well: those matrices stay float32 beside the held ones).
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from exactdraft.errors import WeightError
from exactdraft.formats import QuantizedTensor
from exactdraft.guard import probe_tokens
from exactdraft.loading.safetensors_file import SafetensorsTensors
from exactdraft.pretrained import build_target, load_checkpoint
from tests.loading.test_checkpoint import bfloat16_drafted_runs as drafted_runs
from tests.loading.test_fp8_blocks import fp8_checkpoint

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def edited_copy(folder: str, destination, edit) -> str:
    """A copy of a checkpoint folder with `edit` applied to its tensors."""
    copy = shutil.copytree(folder, destination)
    path = os.path.join(copy, "model.safetensors")
    state = safetensors_torch.load_file(path)
    edit(state)
    safetensors_torch.save_file(state, path)
    return copy


@pytest.fixture(scope="module")
def qwen3_fp8(tmp_path_factory) -> str:
    from tests.conftest import build_tiny_checkpoint

    source = build_tiny_checkpoint(str(tmp_path_factory.mktemp("qwen3_float")), "qwen3")
    fp8, _ = fp8_checkpoint(source, str(tmp_path_factory.mktemp("qwen3") / "model"), (128, 128))
    return fp8


@pytest.fixture(scope="module")
def deepseek_fp8(tmp_path_factory) -> str:
    from tests.models.families.test_deepseek_v3 import DEEPSEEK_V3, build_checkpoint

    source = build_checkpoint(str(tmp_path_factory.mktemp("deepseek_float")), DEEPSEEK_V3)
    fp8, _ = fp8_checkpoint(source, str(tmp_path_factory.mktemp("deepseek") / "model"),
                            (128, 128))
    return fp8


def fp8_names(folder: str) -> list[str]:
    entries = SafetensorsTensors([os.path.join(folder, "model.safetensors")]).entries
    return sorted(name for name, entry in entries.items() if entry.dtype == "F8_E4M3")


def logits(folder: str, keep_quantized: bool, backend: str = "torch") -> np.ndarray:
    target = build_target(load_checkpoint(folder, keep_quantized=keep_quantized), backend)
    tokens = probe_tokens(24, target.vocab_size, salt=5)
    return np.asarray(target.forward(target.new_state(), tokens, rows="all"), np.float32)


def test_every_fitting_fp8_matrix_is_held_in_blocks(qwen3_fp8, deepseek_fp8):
    for folder, float32_names in ((qwen3_fp8, set()), (deepseek_fp8, {
            "o_proj", "q_b_proj", "kv_b_proj"})):
        tensors = load_checkpoint(folder).tensors
        names = fp8_names(folder)
        assert names
        for name in names:
            value = tensors[name]
            if name.split(".")[-2] in float32_names:  # columns 50, 24, 20
                assert isinstance(value, np.ndarray) and value.dtype == np.float32, name
            else:
                assert isinstance(value, QuantizedTensor) and value.format == "fp8_e4m3", name
        # keep_quantized=False: every one float32, as before.
        dense = load_checkpoint(folder, keep_quantized=False).tensors
        assert all(isinstance(dense[name], np.ndarray) for name in names)


@pytest.mark.parametrize("model", ["qwen3", "deepseek_v3"])
@pytest.mark.parametrize("backend", ["torch", "torch-padded"])
def test_held_blocks_give_the_logits_of_the_float32_path(qwen3_fp8, deepseek_fp8, model,
                                                         backend):
    """On the C kernels the blocks are multiplied as they are; the padded torch backend, which
    takes no QuantizedTensor, dequantizes them at load."""
    folder = qwen3_fp8 if model == "qwen3" else deepseek_fp8
    held = logits(folder, True, backend)
    assert held.tobytes() == logits(folder, False, backend).tobytes()


def test_one_changed_code_changes_the_logits(qwen3_fp8, tmp_path):
    """Negative control: the held path reads the codes (a changed one gives other logits)."""
    name = "model.layers.0.mlp.down_proj.weight"

    def edit(state):
        state[name].view(torch.uint8)[5, 9] ^= 0x08

    folder = edited_copy(qwen3_fp8, tmp_path / "edited", edit)
    assert isinstance(load_checkpoint(folder).tensors[name], QuantizedTensor)
    assert logits(folder, True).tobytes() != logits(qwen3_fp8, True).tobytes()


def test_held_blocks_keep_drafted_equal_to_serial(qwen3_fp8):
    target = build_target(load_checkpoint(qwen3_fp8), "torch")
    drafted_runs(target, True).assert_exact()


def test_negative_control_held_blocks_on_an_inexact_backend(qwen3_fp8, one_torch_thread):
    """The same comparison fails on unpadded MKL matmuls and SDPA (tests/inexact.py)."""
    from tests.inexact import InexactTorchBackend

    target = build_target(load_checkpoint(qwen3_fp8), InexactTorchBackend())
    drafted_runs(target, False).assert_caught()


def held_bytes(folder: str, keep_quantized: bool) -> tuple[int, int]:
    """(bytes the torch CPU backend holds for the checkpoint's fp8 matrices, bytes the file
    stores for them: codes and scales)."""
    from exactdraft.backends.torch_cpu import TorchCPUBackend

    entries = SafetensorsTensors([os.path.join(folder, "model.safetensors")]).entries
    tensors = load_checkpoint(folder, keep_quantized=keep_quantized).tensors
    backend = TorchCPUBackend()
    held = stored = 0
    for name in fp8_names(folder):
        matrix = backend.matrix(tensors[name])
        held += sum(part.data.nbytes for part in matrix.packed)
        for entry in (entries[name], entries[name + "_scale_inv"]):
            stored += entry.end - entry.begin
    return held, stored


def test_held_bytes_are_about_the_files(qwen3_fp8):
    held, stored = held_bytes(qwen3_fp8, keep_quantized=True)
    assert held <= 1.15 * stored, held / stored
    print(f"fp8 matrices: file {stored} bytes, held {held} bytes ({held / stored:.4f}x)")
    # Negative control: the float32 path holds four bytes a weight, over the bound.
    dense, _ = held_bytes(qwen3_fp8, keep_quantized=False)
    assert dense > 1.15 * stored, dense / stored


def test_nan_codes_and_bad_scales_are_still_refused(qwen3_fp8, tmp_path):
    name = "model.layers.0.self_attn.o_proj.weight"  # 64x128, held in blocks

    def nan(state):
        state[name].view(torch.uint8)[3, 70] = 0xFF

    def infinite(state):
        state[name + "_scale_inv"][0, 0] = float("inf")

    for edit, message in ((nan, rf"tensor '{name}' holds the fp8 NaN code at \(3, 70\)"),
                          (infinite, rf"tensor '{name}_scale_inv' holds inf at \(0, 0\)")):
        folder = edited_copy(qwen3_fp8, tmp_path / edit.__name__, edit)
        for keep_quantized in (True, False):
            with pytest.raises(WeightError, match=message):
                load_checkpoint(folder, keep_quantized=keep_quantized).tensors[name]
