"""The draft head's draft vocabulary (exactdraft/drafters/head_model.py, head.py): a head trained
with a vocabulary much smaller than the target's drafts only ids inside it and writes the serial
tokens bit for bit (negative control: the same head on a target whose multi-row passes are off
by ulps); its files keep the vocabulary bit for bit; a file with a bad vocabulary is refused
with the file and the id named."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import exactdraft as xd
from exactdraft import CheckpointError, DraftHead, SamplingParams
from exactdraft.drafters.head_model import HeadWeights
from exactdraft.training import TrainingSettings, train_draft_head
from tests.drafters.test_head import PROMPTS, TINY_TRAINING
from tests.exactness import ExactnessCheck

DRAFT_VOCAB = 24  # of the tiny targets' 128


@pytest.fixture(scope="module")
def small_head(tiny_targets, tiny_checkpoints, tmp_path_factory) -> str:
    """The folder of a head with a DRAFT_VOCAB-token vocabulary for the tiny llama."""
    from exactdraft.pretrained import load_checkpoint

    folder = str(tmp_path_factory.mktemp("small-vocabulary-head"))
    tokenizer = load_checkpoint(tiny_checkpoints["llama"]).tokenizer
    settings = TrainingSettings(**{**TINY_TRAINING.__dict__, "draft_vocab": DRAFT_VOCAB})
    train_draft_head(xd.Generator(tiny_targets["llama"], tokenizer=tokenizer), folder, settings,
                     progress=False)
    return folder


class RecordingHead(DraftHead):
    """A DraftHead that keeps every token it proposes."""

    proposed: list[int]

    def propose(self, sequence, limit):
        drafts = super().propose(sequence, limit)
        self.proposed = getattr(self, "proposed", []) + list(drafts)
        return drafts


def compare(target, folder, check: ExactnessCheck, **generator_options) -> list[RecordingHead]:
    serial = xd.Generator(target)
    heads = []
    for temperature in (0.0, 0.8):
        for seed in range(3):
            head = RecordingHead(target, HeadWeights.load(folder), max_draft=4, source=folder)
            heads.append(head)
            drafted = xd.Generator(target, head, adaptive_depth=False, **generator_options)
            params = SamplingParams(temperature=temperature, seed=seed, top_k=40 * (seed % 2))
            check.compare(drafted, PROMPTS[seed], 24, params, serial=serial, stop_tokens=[],
                          label=f"t={temperature} seed {seed}")
    return heads


def test_a_small_vocabulary_head_drafts_inside_it_and_writes_the_serial_tokens(tiny_targets,
                                                                              small_head):
    target = tiny_targets["llama"]
    head = DraftHead.from_pretrained(small_head, target)
    vocabulary = set(head.draft_ids.tolist())
    assert len(vocabulary) == head.weights.config.draft_vocab_size == DRAFT_VOCAB
    check = ExactnessCheck()
    heads = compare(target, small_head, check)
    check.assert_exact(min_accepted=3, some_rejected=True)
    proposed = [token for drafter in heads for token in drafter.proposed]
    assert proposed and set(proposed) <= vocabulary
    # The restriction bites: the serial runs write tokens the head can never propose.
    serial = xd.Generator(target)
    written = {token for seed in range(3) for temperature in (0.0, 0.8)
               for token in serial.generate(PROMPTS[seed], 24, temperature=temperature,
                                            seed=seed, stop_tokens=[]).tokens}
    assert written - vocabulary


def test_negative_control_a_small_vocabulary_head_on_an_inexact_target(inexact_targets,
                                                                       small_head):
    check = ExactnessCheck()
    compare(inexact_targets("llama"), small_head, check, guard=False)
    check.assert_caught()


def test_files_keep_the_vocabulary_bit_for_bit(tiny_targets, small_head, tmp_path):
    from safetensors.numpy import load_file

    weights = HeadWeights.load(small_head)
    assert weights.tensors["draft_ids"].dtype == np.int64
    for dtype in ("float16", "float32"):
        weights.save(tmp_path / dtype, dtype=dtype)
        stored = load_file(str(tmp_path / dtype / "head.safetensors"))["draft_ids"]
        assert stored.dtype == np.int32
        assert stored.astype(np.int64).tobytes() == weights.tensors["draft_ids"].tobytes()
        loaded = DraftHead.from_pretrained(tmp_path / dtype, tiny_targets["llama"])
        assert loaded.draft_ids.tobytes() == weights.tensors["draft_ids"].tobytes()


def rewritten(folder, destination, draft_ids: np.ndarray | None):
    """A copy of the head in `folder` whose stored draft_ids are `draft_ids` as given (None:
    none stored)."""
    from safetensors.numpy import load_file, save_file

    HeadWeights.load(folder).save(destination, dtype="float32")
    path = destination / "head.safetensors"
    tensors = load_file(str(path))
    tensors["draft_ids"] = draft_ids
    save_file({name: value for name, value in tensors.items() if value is not None}, str(path))
    return destination


def test_bad_vocabularies_are_refused_by_name(tiny_targets, small_head, tmp_path):
    target = tiny_targets["llama"]
    ids = HeadWeights.load(small_head).tensors["draft_ids"].astype(np.int32)
    last = len(ids) - 1
    cases = {
        "outside": (np.concatenate([ids[:-1], [128]]).astype(np.int32),
                    rf"draft_ids\[{last}\] = 128 is outside the target's vocabulary \[0, 128\)"),
        "negative": (np.concatenate([[-1], ids[1:]]).astype(np.int32),
                     r"draft_ids\[0\] = -1 is outside"),
        "repeated": (np.concatenate([ids[:-1], ids[:1]]).astype(np.int32),
                     f"draft_ids holds id {int(ids[0])} 2 times"),
        "descending": (ids[::-1].copy(), "draft_ids must be ascending"),
        "float": (ids.astype(np.float32), "'draft_ids' is stored as float32"),
        "narrow": (ids.astype(np.int16), "'draft_ids' is stored as int16"),
        "missing": (None, "tensor 'draft_ids' is missing"),
    }
    for name, (bad, message) in cases.items():
        folder = rewritten(small_head, tmp_path / name, bad)
        with pytest.raises(CheckpointError, match=message) as caught:
            DraftHead.from_pretrained(folder, target)
        assert str(folder / "head.safetensors") in str(caught.value), name
    # Negative control: the same rewrite with the head's own ids loads, and int64 ids too.
    for name, good in (("int32", ids), ("int64", ids.astype(np.int64))):
        folder = rewritten(small_head, tmp_path / name, good)
        assert DraftHead.from_pretrained(folder, target).draft_ids.tolist() == ids.tolist()


def test_weights_of_another_dtype_are_refused(small_head, tmp_path):
    from safetensors.numpy import load_file, save_file

    HeadWeights.load(small_head).save(tmp_path, dtype="float32")
    path = tmp_path / "head.safetensors"
    tensors = load_file(str(path))
    tensors["fc.weight"] = tensors["fc.weight"].astype(np.int8)
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match="'fc.weight' is stored as int8"):
        HeadWeights.load(tmp_path)


def test_an_in_memory_vocabulary_is_checked_too(small_head):
    weights = HeadWeights.load(small_head)
    ids = weights.tensors["draft_ids"]
    with pytest.raises(CheckpointError, match="draft_ids has dtype int32, not int64"):
        HeadWeights(weights.config, {**weights.tensors, "draft_ids": ids.astype(np.int32)})
    with pytest.raises(CheckpointError, match=r"<head>: draft_ids\[0\] = 500 is outside"):
        HeadWeights(weights.config, {**weights.tensors,
                                     "draft_ids": np.concatenate([[500], ids[1:]])})
    empty = dataclasses.replace(weights.config, draft_vocab_size=0)
    with pytest.raises(CheckpointError, match="draft_ids is empty"):
        HeadWeights(empty, {**weights.tensors, "draft_ids": ids[:0]})
