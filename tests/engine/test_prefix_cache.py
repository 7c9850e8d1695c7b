"""A prefix-cache hit changes nothing: a request whose prompt starts with cached blocks writes
the tokens and logprobs of a cold run, and every row has the cold run's bytes, whatever the
hit length and the prompt chunking, on tiny models of every family; with a negative control (a
cache that keeps its blocks in bfloat16, as lossy KV caches do). Adversarial prompts: one token
changed at the first or last position of a block hits only the blocks before it, and a block's
tokens after another prefix (A = X + Y, then B = Z + Y, then B again) are never A's block.
Blocks are shared, held while used and evicted least recently used under the budget; a prompt
bigger than the budget leaves its longest prefix that fits, which the next request reuses with a
cold run's bits; the default budget follows the available memory; cache files round-trip, and
corrupt, truncated or foreign files are ignored with a warning."""

from __future__ import annotations

import os

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.engine import (
    Engine,
    PrefixCache,
    load_prefix_cache,
    prefix_cache,
    save_prefix_cache,
)
from exactdraft.engine.prefix_cache import Block, default_budget_bytes
from exactdraft.guard import probe_tokens
from tests.conftest import VARIANTS
from tests.engine.rows import ContextRows, row_differences

BASE = probe_tokens(40, 128, salt=7)
# (prompt, prompt tokens per pass): hits of 1, 2 and 4 blocks and the whole base, chunked
# differently from the run that filled the cache.
FOLLOW_UPS = [
    (BASE[:9] + [1, 2, 3], 5),
    (BASE[:20] + probe_tokens(7, 128, salt=8), 64),
    (BASE[:33] + [9], 3),
    (BASE + probe_tokens(12, 128, salt=9), 16),
]
SETTINGS = dict(max_new_tokens=14, temperature=0.8, top_p=0.95, seed=21, logprobs=2,
                stop_tokens=[])


def hits_against_cold(generator, cache, follow_ups=FOLLOW_UPS, base=BASE):
    """(problems, prompt positions taken from the cache per follow-up) after `base` ran."""
    recorder = generator.sampler
    with Engine(generator, prefix_cache=cache, max_pass_tokens=16) as engine:
        engine.submit(base, **SETTINGS).results(timeout=60)
    problems, hits = [], []
    for prompt, chunk in follow_ups:
        before = cache.stats.hit_tokens
        recorder.forget()
        with Engine(generator, prefix_cache=cache, max_pass_tokens=chunk) as engine:
            hit = engine.submit(prompt, **SETTINGS).results(timeout=60)[0]
        hits.append(cache.stats.hit_tokens - before)
        warm = dict(recorder.rows)
        recorder.forget()
        cold = generator.generate(prompt, **SETTINGS)
        if (hit.tokens, hit.logprobs) != (cold.tokens, cold.logprobs):
            problems.append(f"{len(prompt)}-token prompt: tokens or logprobs differ")
        problems += row_differences(warm, recorder.rows)
    return problems, hits


def caching_generator(target):
    return xd.Generator(target, xd.PromptLookup(max_draft=4, min_match=1), sampler=ContextRows(),
                        adaptive_depth=False)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_cache_hit_writes_what_a_cold_run_writes(variant, tiny_targets):
    cache = PrefixCache(block_tokens=8)
    problems, hits = hits_against_cold(caching_generator(tiny_targets[variant]), cache)
    assert not problems, problems[:5]
    assert hits == [8, 16, 32, 40]


def one_token_changed(tokens: list[int], position: int) -> list[int]:
    changed = list(tokens)
    changed[position] = (changed[position] + 1) % 128
    return changed


# BASE with one token changed at the first and at the last position of a block (blocks of 8):
# the blocks before it are hits, the block holding it and every block after it are misses.
EDGE_POSITIONS = (0, 7, 8, 15, 31)


def test_a_prompt_one_token_off_at_a_block_edge_takes_only_the_blocks_before_it(tiny_targets):
    cache = PrefixCache(block_tokens=8)
    follow_ups = [(one_token_changed(BASE, position), 16) for position in EDGE_POSITIONS]
    problems, hits = hits_against_cold(caching_generator(tiny_targets["llama"]), cache,
                                       follow_ups=follow_ups)
    assert not problems, problems[:5]
    assert hits == [position // 8 * 8 for position in EDGE_POSITIONS]


# Three one-block pieces: A = X + Y, then B = Z + Y (its second block holds A's tokens after
# another prefix), then B again (a hit of both of B's own blocks, never A's block for Y).
X, Y, Z = (probe_tokens(8, 128, salt=salt) for salt in (11, 12, 13))


def test_a_block_after_another_prefix_is_not_the_same_block(tiny_targets):
    cache = PrefixCache(block_tokens=8)
    follow_ups = [(Z + Y + [5, 6], 4), (Z + Y + [5, 6], 16)]
    problems, hits = hits_against_cold(caching_generator(tiny_targets["llama"]), cache,
                                       follow_ups=follow_ups, base=X + Y + [5, 6])
    assert not problems, problems[:5]
    assert hits == [0, 16]


class BFloat16Cache(PrefixCache):
    """A plausible wrong cache: blocks kept at bfloat16 precision to save memory."""

    def _insert(self, block: Block) -> Block | None:
        for array in (block.keys, block.values):
            array.view(np.uint32)[...] &= np.uint32(0xFFFF0000)
        return super()._insert(block)


def test_negative_control_a_lossy_cache_is_caught(tiny_targets):
    problems, hits = hits_against_cold(caching_generator(tiny_targets["llama"]),
                                       BFloat16Cache(block_tokens=8))
    assert hits[1] > 0 and any(p.startswith("context ending") for p in problems), problems


def test_blocks_are_held_while_used_and_evicted_least_recently_used(tiny_targets):
    target = tiny_targets["llama"]
    state = target.new_state()
    target.forward(state, BASE)
    cache = PrefixCache(block_tokens=8)
    chain = cache.store(target, state, BASE, [])
    block_bytes = chain[0].nbytes
    assert len(chain) == 5 and all(b.references == 1 for b in chain)
    cache.budget_bytes = 2 * block_bytes
    cache.release([])  # over budget, but every block is held: nothing goes
    assert len(cache) == 5
    again = cache.acquire(BASE[:20])
    assert again == chain[:2] and chain[0].references == 2
    cache.release(chain)
    assert len(cache) == 2 and cache.blocks() == chain[:2]  # the held ones, chain ends first
    cache.release(again)
    other = probe_tokens(16, 128, salt=3)
    state = target.new_state()
    target.forward(state, other)
    fresh = cache.store(target, state, other, [])
    cache.release(fresh)
    assert cache.blocks() == fresh and cache.acquire(BASE) == []


def block_bytes_of(target) -> int:
    state = target.new_state()
    target.forward(state, BASE[:8])
    return PrefixCache(block_tokens=8).store(target, state, BASE[:8], [])[0].nbytes


@pytest.mark.parametrize("cache_class", [PrefixCache, BFloat16Cache])
def test_a_prompt_bigger_than_the_budget_keeps_its_longest_prefix_that_fits(tiny_targets,
                                                                            cache_class):
    target = tiny_targets["llama"]
    cache = cache_class(budget_bytes=3 * block_bytes_of(target), block_tokens=8)
    generator = caching_generator(target)
    # BASE is 5 blocks; its run (prompt, then prompt and reply) leaves the first 3.
    follow_up = BASE + probe_tokens(6, 128, salt=4)
    try:
        problems, hits = hits_against_cold(generator, cache, [(follow_up, 16)])
    except AssertionError as diverged:  # rows so far off that the tokens themselves differ
        problems, hits = [f"diverged: {diverged}"], [cache.stats.hit_tokens]
    assert hits == [24] and cache.bytes <= cache.budget_bytes
    assert [b.tokens for b in cache.blocks()] == [tuple(BASE[i:i + 8]) for i in (0, 8, 16)]
    with Engine(generator, prefix_cache=cache) as engine:
        submission = engine.submit(follow_up, **SETTINGS)
        submission.results(timeout=60)
    assert submission.cached_tokens == [24]
    if cache_class is PrefixCache:
        assert not problems, problems[:5]
    else:  # negative control: the lossy cache's hit is caught by the same comparison
        assert problems and all(p.startswith(("context ending", "diverged")) for p in problems)


def test_the_default_budget_is_a_quarter_of_the_available_memory_within_bounds(monkeypatch):
    mib, gib = 2**20, 2**30
    assert default_budget_bytes(16 * gib) == 4 * gib
    assert default_budget_bytes(3 * gib) == 768 * mib
    assert default_budget_bytes(512 * mib) == 256 * mib  # the floor
    assert default_budget_bytes(64 * gib) == 8 * gib  # the cap
    assert default_budget_bytes(None) == 256 * mib  # memory unknown: the floor
    monkeypatch.setattr(prefix_cache, "available_memory_bytes", lambda: 6 * gib)
    assert PrefixCache().budget_bytes == 1536 * mib
    assert PrefixCache(budget_bytes=1000).budget_bytes == 1000  # an explicit budget wins


def filled_cache(target) -> PrefixCache:
    cache = PrefixCache(block_tokens=8)
    state = target.new_state()
    target.forward(state, BASE)
    cache.release(cache.store(target, state, BASE, []))
    return cache


def test_a_cache_file_round_trips_and_a_loaded_hit_equals_a_cold_run(tiny_targets, tmp_path):
    target = tiny_targets["qwen2"]
    path = tmp_path / "prefixes.safetensors"
    assert save_prefix_cache(filled_cache(target), path, target) == 5
    assert os.listdir(tmp_path) == ["prefixes.safetensors"]  # no temporary file left
    loaded = PrefixCache(block_tokens=8)
    assert load_prefix_cache(loaded, path, target) == 5
    generator = caching_generator(target)
    recorder = generator.sampler
    prompt = BASE[:30] + [4, 5]
    with Engine(generator, prefix_cache=loaded) as engine:
        warm = engine.submit(prompt, **SETTINGS).results(timeout=60)[0]
    rows = dict(recorder.rows)
    recorder.forget()
    cold = generator.generate(prompt, **SETTINGS)
    assert loaded.stats.hit_tokens == 24
    assert (warm.tokens, warm.logprobs) == (cold.tokens, cold.logprobs)
    assert not row_differences(rows, recorder.rows)


def damaged(path, kind: str, tiny_targets) -> None:
    data = bytearray(path.read_bytes())
    if kind == "corrupt":
        data[-100] ^= 0x01  # one bit of one key
        path.write_bytes(bytes(data))
    elif kind == "truncated":
        path.write_bytes(bytes(data[:len(data) // 2]))
    elif kind == "garbage":
        path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    elif kind == "foreign":
        other = tiny_targets["mistral"]
        save_prefix_cache(filled_cache(other), path, other)


@pytest.mark.parametrize("kind, reason", [
    ("corrupt", "recorded sha256"), ("truncated", "not a readable safetensors"),
    ("garbage", "not a readable safetensors"), ("foreign", "weights_digest"),
    ("missing", "not a readable safetensors"),
])
def test_a_damaged_or_foreign_cache_file_is_ignored_with_a_warning(kind, reason, tiny_targets,
                                                                    tmp_path):
    target = tiny_targets["qwen2"]
    path = tmp_path / "prefixes.safetensors"
    if kind != "missing":
        save_prefix_cache(filled_cache(target), path, target)
        damaged(path, kind, tiny_targets)
    cache = PrefixCache(block_tokens=8)
    with pytest.warns(RuntimeWarning, match=reason) as caught:
        assert load_prefix_cache(cache, path, target) == 0
    assert str(path) in str(caught[0].message) and len(cache) == 0


def test_a_failed_save_leaves_no_file_behind(tiny_targets, tmp_path):
    target = tiny_targets["qwen2"]
    (tmp_path / "taken").mkdir()  # a folder where the file should go: the rename fails
    with pytest.raises(OSError):
        save_prefix_cache(filled_cache(target), tmp_path / "taken", target)
    assert os.listdir(tmp_path) == ["taken"] and not os.listdir(tmp_path / "taken")
