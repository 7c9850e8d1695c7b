"""Shared passes and prefix-cache hits on the real checkpoint (SmolLM2-135M-Instruct): every
sample equals its request run alone and every hit a cold run, row bytes included; the negative
controls live with the tiny models (test_batched.py, test_prefix_cache.py)."""

from __future__ import annotations

import pytest

import exactdraft as xd
from exactdraft.engine import PrefixCache
from exactdraft.pretrained import build_target, load_checkpoint
from tests.conftest import needs_smollm2
from tests.engine.rows import ContextRows
from tests.engine.test_batched import compare_with_alone
from tests.engine.test_prefix_cache import hits_against_cold

pytestmark = needs_smollm2


@pytest.fixture(scope="module")
def smollm2_generator():
    checkpoint = load_checkpoint(None)
    target = build_target(checkpoint, "torch")
    return xd.Generator(target, xd.PromptLookup(max_draft=4), sampler=ContextRows(),
                        tokenizer=checkpoint.tokenizer, adaptive_depth=False)


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_shared_passes_equal_runs_alone_on_smollm2(smollm2_generator):
    requests = [
        (chat("Rename `count` to `total`: def f(xs):\n    count = 0\n    for x in xs:\n"
              "        count += x\n    return count"), dict(max_new_tokens=16, temperature=0.0)),
        (chat("Give two tips for clear emails."),
         dict(max_new_tokens=12, temperature=0.7, top_p=0.95, seed=3, n=2, logprobs=3)),
        (chat("What is 17 times 23?"), dict(max_new_tokens=10, temperature=1.0, seed=5,
                                            drafts=False)),
    ]
    problems, stats, kept = compare_with_alone(smollm2_generator, requests, max_pass_tokens=32)
    assert not problems, problems[:5]
    assert max(stats.sequences_per_pass) >= 3 and stats.mixed_passes > 0 and kept > 0


def test_a_cache_hit_equals_a_cold_run_on_smollm2(smollm2_generator):
    tokenizer = smollm2_generator.tokenizer
    system = "You are a careful assistant who answers in one short paragraph. " * 3
    base = tokenizer.encode(tokenizer.render_chat(
        [{"role": "system", "content": system}, {"role": "user", "content": "Hi!"}]))
    follow_ups = [(base[:40] + tokenizer.encode(" Why is the sky blue?"), 16),
                  (base + tokenizer.encode(" And the sea?"), 64)]
    cache = PrefixCache(block_tokens=16)
    problems, hits = hits_against_cold(smollm2_generator, cache, follow_ups, base)
    assert not problems, problems[:5]
    assert hits[0] == 32 and hits[1] >= 16 * (len(base) // 16)

