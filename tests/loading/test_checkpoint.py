"""Loading checkpoints from folders, shards and the hub cache, and refusing bad ones clearly."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.errors import CheckpointError, ConfigError, WeightError
from exactdraft.loading.safetensors_file import SafetensorsTensors
from exactdraft.pretrained import build_target, load_checkpoint
from tests.conftest import build_tiny_checkpoint
from tests.exactness import ExactnessCheck


def copy_checkpoint(source: str, destination) -> str:
    shutil.copytree(source, destination)
    return str(destination)


def test_from_pretrained_folder_runs(tiny_checkpoints):
    generator = xd.Generator.from_pretrained(tiny_checkpoints["llama"], backend="torch",
                                             drafter=xd.PromptLookup())
    result = generator.generate([1, 2, 3, 1, 2, 3], 8, xd.SamplingParams(seed=0))
    assert len(result.tokens) >= 1 and isinstance(result.text, str)
    assert result.stats.drafting  # the guard passed on the loaded checkpoint


def test_sharded_checkpoint_equals_single_file(tmp_path, tiny_checkpoints):
    import torch
    import transformers

    single = tiny_checkpoints["llama"]
    model = transformers.AutoModelForCausalLM.from_pretrained(single, dtype=torch.float32)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert os.path.isfile(tmp_path / "model.safetensors.index.json")
    sharded = load_checkpoint(str(tmp_path))
    whole = load_checkpoint(single)
    assert len(sharded.tensors.entries) == len(whole.tensors.entries)
    for name in whole.tensors:
        assert np.array_equal(sharded.tensors[name], whole.tensors[name])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_weights_widen_exactly(tmp_path, tiny_checkpoints, dtype):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoints["qwen2"],
                                                              dtype=getattr(torch, dtype))
    model.save_pretrained(tmp_path)
    tensors = load_checkpoint(str(tmp_path)).tensors
    name = "model.layers.0.self_attn.q_proj.weight"
    expected = model.state_dict()[name].float().numpy()
    assert tensors[name].dtype == np.float32
    assert tensors[name].tobytes() == expected.tobytes()


def bfloat16_drafted_runs(target, guard) -> ExactnessCheck:
    # Every draft verified (no timed depth policy, which a busy machine can talk out of
    # drafting), so multi-row passes are surely compared.
    drafted = xd.Generator(target, xd.PromptLookup(min_match=1), guard=guard,
                           adaptive_depth=False)
    check = ExactnessCheck()
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    for seed, temperature in ((5, 0.7), (0, 0.0), (1, 0.3)):
        check.compare(drafted, prompt, 20, xd.SamplingParams(temperature=temperature, seed=seed),
                      serial=xd.Generator(target), stop_tokens=[])
    return check


def test_bfloat16_compute_keeps_drafted_equal_to_serial(tiny_checkpoints):
    target = build_target(load_checkpoint(tiny_checkpoints["llama"]), "torch",
                          dtype="bfloat16")
    # The guard found bf16 passes row invariant here, or the warning fails the test.
    bfloat16_drafted_runs(target, True).assert_exact()


def test_negative_control_bfloat16_drafted_runs(tiny_checkpoints, inexact_targets):
    """The same comparison fails on torch's plain ops in bfloat16 (the inexact_targets
    fixture keeps torch on one thread meanwhile)."""
    from exactdraft.guard import check_row_invariance
    from tests.inexact import InexactTorchBackend

    target = build_target(load_checkpoint(tiny_checkpoints["llama"]),
                          InexactTorchBackend(dtype="bfloat16"))
    if check_row_invariance(target, 5) is None:
        pytest.skip("torch's plain bfloat16 ops gave 2..5-row passes the bits of single steps "
                    "on this machine (measured by the guard), so there is no inexact bfloat16 "
                    "backend here to catch")
    bfloat16_drafted_runs(target, False).assert_caught()


def test_unknown_model_type_lists_supported(tmp_path, tiny_checkpoints):
    folder = copy_checkpoint(tiny_checkpoints["llama"], tmp_path / "m")
    config = json.load(open(os.path.join(folder, "config.json")))
    config["model_type"] = "gpt_neox"
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    with pytest.raises(ConfigError, match="'gpt_neox'.*llama, mistral, .*qwen2, qwen3"):
        load_checkpoint(folder)


def test_missing_tensor_is_named(tmp_path, tiny_checkpoints):
    from safetensors.numpy import load_file, save_file

    folder = copy_checkpoint(tiny_checkpoints["llama"], tmp_path / "m")
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path)
    with pytest.raises(WeightError, match="model.layers.1.mlp.up_proj.weight"):
        build_target(load_checkpoint(folder), "torch")


def test_misshapen_tensor_is_named(tmp_path, tiny_checkpoints):
    from safetensors.numpy import load_file, save_file

    folder = copy_checkpoint(tiny_checkpoints["llama"], tmp_path / "m")
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 64), np.float32)
    save_file(tensors, path)
    with pytest.raises(WeightError, match=r"k_proj.weight.*\(8, 64\).*\(32, 64\)"):
        build_target(load_checkpoint(folder), "torch")


@pytest.mark.parametrize("keep_bytes", [4, 100, -10])
def test_truncated_safetensors_is_refused(tmp_path, tiny_checkpoints, keep_bytes):
    folder = copy_checkpoint(tiny_checkpoints["llama"], tmp_path / "m")
    path = os.path.join(folder, "model.safetensors")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:keep_bytes])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(folder)


def test_pickle_only_folder_is_refused(tmp_path, tiny_checkpoints):
    folder = copy_checkpoint(tiny_checkpoints["llama"], tmp_path / "m")
    os.rename(os.path.join(folder, "model.safetensors"), os.path.join(folder, "pytorch_model.bin"))
    with pytest.raises(CheckpointError, match="only safetensors and GGUF"):
        load_checkpoint(folder)


def test_missing_path_is_named():
    with pytest.raises(CheckpointError, match="no model at '/no/such/place'"):
        load_checkpoint("/no/such/place")


def test_uncached_hub_id_offline_names_the_id(tmp_path):
    with pytest.raises(CheckpointError, match="'someone/not-cached-model'"):
        load_checkpoint("someone/not-cached-model", cache_dir=str(tmp_path))


def test_cached_hub_id_loads_offline(tmp_path, tiny_checkpoints):
    """A hub id resolves through huggingface_hub's cache layout without network."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--someone--tiny-llama"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(tiny_checkpoints["llama"], snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    checkpoint = load_checkpoint("someone/tiny-llama", cache_dir=str(tmp_path))
    assert checkpoint.config.model_type == "llama"
    assert os.path.samefile(checkpoint.source, snapshot)


def test_tensor_reader_reads_lazily(tiny_checkpoints):
    tensors = SafetensorsTensors([os.path.join(tiny_checkpoints["llama"], "model.safetensors")])
    assert tensors.shape("model.embed_tokens.weight") == (128, 64)
    assert "lm_head.weight" in tensors


def test_generator_survives_errors(tiny_checkpoints, tmp_path):
    generator = xd.Generator.from_pretrained(build_tiny_checkpoint(str(tmp_path), "mistral"),
                                             backend="torch", drafter=xd.PromptLookup())
    params = xd.SamplingParams(temperature=0.9, seed=12)
    first = generator.generate([9, 8, 7, 9, 8, 7], 12, params)
    assert first.stats.drafting
    before = first.tokens
    for bad in ([], [9, 999], list(range(128)) * 9):
        with pytest.raises(ValueError):
            generator.generate(bad, 12, params)
    with pytest.raises(ValueError):
        generator.generate([1], 12, xd.SamplingParams(temperature=1.0, logit_bias={500: 1.0}))
    assert generator.generate([9, 8, 7, 9, 8, 7], 12, params).tokens == before
