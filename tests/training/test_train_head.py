"""train_draft_head and `exactdraft train-drafter`: the same seed writes the same head bytes,
a resumed run writes the bytes of an uninterrupted one, the torch head computes what the numpy
head drafts with, and the command trains a loadable head on a tiny target."""

from __future__ import annotations

import json

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.cli import main
from exactdraft.training import TrainingSettings, train_draft_head, trainer

SETTINGS = TrainingSettings(epochs=2, max_new_tokens=12, samples=1, draft_vocab=64,
                            prompt_limit=6, batch_size=2, validation=2, warmup_steps=2,
                            learning_rate=3e-3)


@pytest.fixture(scope="module")
def generator(tiny_targets, tiny_checkpoints):
    from exactdraft.pretrained import load_checkpoint

    return xd.Generator(tiny_targets["llama"],
                        tokenizer=load_checkpoint(tiny_checkpoints["llama"]).tokenizer)


def head_bytes(folder) -> tuple[bytes, bytes]:
    return (folder / "head.safetensors").read_bytes(), (folder / "config.json").read_bytes()


def test_the_same_seed_writes_the_same_head(generator, tmp_path):
    for name in ("a", "b"):
        train_draft_head(generator, tmp_path / name, SETTINGS, progress=False)
    assert head_bytes(tmp_path / "a") == head_bytes(tmp_path / "b")
    train_draft_head(generator, tmp_path / "c", TrainingSettings(**{**SETTINGS.__dict__,
                                                                   "seed": 1}),
                     progress=False)
    assert head_bytes(tmp_path / "c")[0] != head_bytes(tmp_path / "a")[0]


def test_a_resumed_run_equals_an_uninterrupted_one(generator, tmp_path, monkeypatch, capsys):
    train_draft_head(generator, tmp_path / "whole", SETTINGS, progress=False)
    original = trainer._checkpoint

    def interrupted(folder, identity, epoch, *rest):
        original(folder, identity, epoch, *rest)
        if epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer, "_checkpoint", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_draft_head(generator, tmp_path / "cut", SETTINGS, progress=False)
    monkeypatch.setattr(trainer, "_checkpoint", original)
    assert not (tmp_path / "cut" / "head.safetensors").exists()
    capsys.readouterr()
    train_draft_head(generator, tmp_path / "cut", SETTINGS, progress=True)
    lines = capsys.readouterr().err
    assert "epoch 1/2 done" not in lines and "epoch 2/2 done" in lines  # it resumed
    assert "writing the corpus" not in lines  # and kept its corpus
    assert head_bytes(tmp_path / "cut") == head_bytes(tmp_path / "whole")
    progress = json.loads((tmp_path / "cut" / "progress.json").read_text())
    assert progress["epochs_done"] == 2


def test_other_settings_do_not_resume(generator, tmp_path):
    train_draft_head(generator, tmp_path, SETTINGS, progress=False)
    with pytest.raises(xd.ParameterError, match="other settings"):
        train_draft_head(generator, tmp_path,
                         TrainingSettings(**{**SETTINGS.__dict__, "learning_rate": 1e-3}),
                         progress=False)


def test_the_torch_head_computes_what_the_numpy_head_drafts_with():
    """Pass 1 rows equal the numpy head's catch-up rows; pass j rows the numpy head's rows
    when it drafts j - 1 tokens ahead of its last committed row."""
    import torch

    from exactdraft.drafters.head_model import HeadCache, HeadConfig, head_rows
    from exactdraft.training import torch_head

    config = HeadConfig(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8,
                        intermediate_size=48, draft_vocab_size=4, target_digest="x",
                        target_vocab_size=10)
    torch.manual_seed(0)
    module = torch_head.build(config)
    with torch.no_grad():  # the residual branches start at zero: give them weights
        for name in torch_head.NORMS:
            getattr(module, name).add_(0.1 * torch.randn(32))
        for name in ("o", "down"):
            getattr(module, name).weight.normal_(0.0, 0.2)
    weights = torch_head.to_weights(module, config, np.arange(4))
    rng = np.random.default_rng(0)
    length, depth = 12, 3
    embeddings = rng.standard_normal((length, 32)).astype(np.float32)
    features = rng.standard_normal((length, 32)).astype(np.float32)
    with torch.no_grad():
        passes = module(torch.from_numpy(embeddings[1:][None]),
                        torch.from_numpy(features[:-1][None]), depth)
    for last in range(1, length - depth + 1):  # the last committed position
        cache = HeadCache(config)
        rows = head_rows(weights, cache, embeddings[1:last + 1], features[:last],
                         np.arange(1, last + 1))
        np.testing.assert_allclose(rows, passes[0][0, :last].numpy(), atol=1e-5)
        row = rows[-1:]
        for j in range(2, depth + 1):
            position = last + j - 1
            row = head_rows(weights, cache, embeddings[position:position + 1], row,
                            np.array([position]))
            np.testing.assert_allclose(row[0], passes[j - 1][0, position - 1].numpy(),
                                       atol=1e-5)


def test_the_command_trains_a_loadable_head(tiny_checkpoints, tiny_targets, tmp_path, capsys):
    out = tmp_path / "head"
    status = main(["train-drafter", tiny_checkpoints["llama"], "--out", str(out), "--epochs",
                   "1", "--prompt-limit", "6", "--max-new-tokens", "12", "--samples", "1",
                   "--draft-vocab", "20",
                   "--backend", "torch"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "epoch 1/1 done" in captured.err and "ETA" in captured.err
    assert f"draft head written to {out}" in captured.out
    head = xd.DraftHead.from_pretrained(out, tiny_targets["llama"])
    assert head.weights.config.draft_vocab_size == len(head.draft_ids) == 20
    # The 20 tokens the target wrote most often in its corpus (ties: the lower id), counted
    # here from the corpus file.
    from collections import Counter

    examples = json.loads((out / "corpus.json").read_text())["examples"]
    counts = Counter(token for e in examples for token in e["tokens"][e["n_prompt"]:])
    ranked = sorted(range(tiny_targets["llama"].vocab_size), key=lambda t: (-counts[t], t))
    assert head.draft_ids.tolist() == sorted(ranked[:20])
    assert counts[ranked[19]] > 0  # the corpus holds more than 20 distinct tokens
    assert head.weights.config.training["epochs"] == 1


def test_the_command_checks_arguments_before_loading(tmp_path, capsys):
    status = main(["train-drafter", str(tmp_path / "no-such-model"), "--out", str(tmp_path),
                   "--epochs", "0"])
    assert status == 2
    assert "epochs must be an integer >= 1" in capsys.readouterr().err
