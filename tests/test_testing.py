"""exactdraft.testing: helpers for users' reproducibility tests."""

from __future__ import annotations

import json
import os

import pytest

import exactdraft as xd
from exactdraft.check import check_exactness
from exactdraft.testing import (
    assert_drafted_equals_serial,
    assert_reproduces,
    model_fingerprint,
    record_generation,
)
from tests.inexact import KNIFE_PROMPTS, InexactTorchBackend


def test_assert_drafted_equals_serial_passes(tiny_targets, knife_edge_checkpoint):
    generator = xd.Generator(tiny_targets["mistral"], xd.PromptLookup(min_match=1))
    assert_drafted_equals_serial(generator, [[1, 2, 3, 1, 2, 3, 1]], seeds=[0, 1],
                                 max_new_tokens=16)
    # On a checkpoint whose greedy tokens flip on ulp changes, with drafts kept.
    knife = xd.Generator.from_pretrained(knife_edge_checkpoint, backend="torch",
                                         drafter=xd.PromptLookup(min_match=1))
    assert_drafted_equals_serial(knife, KNIFE_PROMPTS, seeds=[0],
                                 sampling=xd.SamplingParams(temperature=0.0), max_new_tokens=40)
    report = check_exactness(knife, KNIFE_PROMPTS, [0], [xd.SamplingParams(temperature=0.0)],
                             40)
    assert all(c.drafted.stats.drafting for c in report.cases)
    assert sum(c.drafted.stats.accepted for c in report.cases) > 0


def test_assert_drafted_equals_serial_fails_on_an_inexact_backend(knife_edge_checkpoint,
                                                                  one_torch_thread):
    """Negative control: with the guard off, the helper reports the drafted runs that the
    backend's ulp-level row-count dependence changes."""
    from exactdraft.pretrained import build_target, load_checkpoint

    target = build_target(load_checkpoint(knife_edge_checkpoint),
                          InexactTorchBackend(split_k=True))
    generator = xd.Generator(target, xd.PromptLookup(min_match=1), guard=False)
    with pytest.raises(AssertionError, match="drafted output differs from serial output"):
        assert_drafted_equals_serial(generator, KNIFE_PROMPTS, seeds=[0],
                                     sampling=xd.SamplingParams(temperature=0.0),
                                     max_new_tokens=40)


def test_assert_drafted_equals_serial_reports_a_guard_failure(tiny_checkpoints):
    from exactdraft.pretrained import build_target, load_checkpoint

    target = build_target(load_checkpoint(tiny_checkpoints["llama"]), InexactTorchBackend())
    with pytest.warns(RuntimeWarning):
        generator = xd.Generator(target, xd.PromptLookup(min_match=1))
    with pytest.raises(AssertionError, match="guard turned drafting off"):
        assert_drafted_equals_serial(generator, [[1, 2, 3, 1, 2, 3]], seeds=[0])


def test_record_and_reproduce(tmp_path, tiny_targets):
    generator = xd.Generator(tiny_targets["qwen3"], xd.PromptLookup(min_match=1))
    path = str(tmp_path / "run.json")
    recorded = record_generation(generator, path, [4, 5, 6, 4, 5, 6], 20,
                                 xd.SamplingParams(temperature=0.9, top_p=0.9))
    saved = json.load(open(path))
    assert saved["tokens"] == recorded.tokens and saved["sampling"]["seed"] == recorded.seed
    assert assert_reproduces(generator, path).tokens == recorded.tokens
    assert assert_reproduces(generator, path, drafts=False).tokens == recorded.tokens
    saved["tokens"][3] = (saved["tokens"][3] + 1) % 128
    json.dump(saved, open(path, "w"))
    with pytest.raises(AssertionError, match="differs at output token 3"):
        assert_reproduces(generator, path)


def test_fingerprint_tells_models_apart(tmp_path, tiny_targets):
    first = xd.Generator(tiny_targets["llama"])
    assert model_fingerprint(first) == model_fingerprint(first)
    other = xd.Generator(tiny_targets["llama-tied"])
    assert model_fingerprint(first) != model_fingerprint(other)
    path = str(tmp_path / "run.json")
    record_generation(first, path, [1, 2, 3], 5, xd.SamplingParams(seed=1))
    with pytest.raises(AssertionError, match="another model or backend"):
        assert_reproduces(other, path)


def test_recording_is_not_left_half_written(tmp_path, tiny_targets, monkeypatch):
    generator = xd.Generator(tiny_targets["llama"])
    path = str(tmp_path / "run.json")

    def explode(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(json, "dump", explode)
    with pytest.raises(RuntimeError):
        record_generation(generator, path, [1, 2, 3], 5, xd.SamplingParams(seed=1))
    assert os.listdir(tmp_path) == []
