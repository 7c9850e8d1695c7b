"""Shared passes change nothing: every sample the engine runs writes the tokens, finish reason,
seed and logprobs of the same request run alone, and every committed token's logits row has the
bytes it has alone (compared by context, tests/engine/rows.py), on tiny models of every family
and on SmolLM2, drafted and not; with a negative control on a backend whose rows change with
the number of rows in a pass."""

from __future__ import annotations

import asyncio
import copy

import pytest

import exactdraft as xd
from exactdraft.engine import Engine, sample_seed
from exactdraft.models.target import capabilities_of
from tests.conftest import VARIANTS
from tests.engine.rows import ContextRows, row_differences
from tests.test_tree_generation import OracleTreeDrafter

PROMPTS = [
    [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7],
    list(range(60, 90)) + list(range(60, 70)),
    [3, 17, 99, 3, 17, 99, 3, 17] * 4,
    [40, 41, 42, 43, 44, 45, 40, 41],
]
REQUESTS = [  # (prompt, options): mixed settings, lengths and sample counts
    (PROMPTS[0], dict(max_new_tokens=24, temperature=0.0, n=2)),
    (PROMPTS[1], dict(max_new_tokens=30, temperature=0.7, top_p=0.9, seed=3, logprobs=2)),
    (PROMPTS[2], dict(max_new_tokens=12, temperature=1.0, top_k=20, seed=4, n=2,
                      repetition_penalty=1.2)),
    (PROMPTS[3], dict(max_new_tokens=20, temperature=1.5, min_p=0.05, seed=5, logprobs=0,
                      drafts=False)),
]


def run_together(generator, requests=REQUESTS, **engine_options):
    """The requests through one engine (few slots and a small prompt budget, so requests wait,
    join as others leave, and prompt chunks share passes with decoding rows)."""
    options = dict(max_sequences=4, max_pass_tokens=16)
    options.update(engine_options)
    with Engine(generator, **options) as engine:
        submissions = [engine.submit(prompt, stop_tokens=[], **settings)
                       for prompt, settings in requests]
        results = [s.results(timeout=120) for s in submissions]
    return submissions, results, engine.stats


def compare_with_alone(generator, requests=REQUESTS, **engine_options):
    """(problems, engine stats, drafts kept): every sample against its request run alone."""
    recorder = generator.sampler
    recorder.forget()
    submissions, results, stats = run_together(generator, requests, **engine_options)
    together = dict(recorder.rows)
    problems = list(recorder.conflicts)
    recorder.forget()
    kept = 0
    for (prompt, settings), submission, samples in zip(requests, submissions, results):
        alone_options = {k: v for k, v in settings.items() if k != "n"}
        for index, result in enumerate(samples):
            kept += result.stats.accepted
            alone_options["seed"] = sample_seed(submission.seeds[0], index)
            alone = generator.generate(prompt, stop_tokens=[], **alone_options)
            for name in ("tokens", "finish_reason", "seed", "logprobs", "text"):
                if getattr(result, name) != getattr(alone, name):
                    problems.append(f"sample {index} of {prompt[:3]}: {name} differs")
    problems += row_differences(together, recorder.rows)
    return problems, stats, kept


def drafting_generator(target, **options):
    return xd.Generator(target, xd.PromptLookup(max_draft=4, min_match=1), sampler=ContextRows(),
                        adaptive_depth=False, **options)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_samples_in_shared_passes_equal_samples_alone(variant, tiny_targets):
    generator = drafting_generator(tiny_targets[variant])
    problems, stats, kept = compare_with_alone(generator)
    assert not problems, problems[:5]
    assert max(stats.sequences_per_pass) >= 3 and stats.mixed_passes > 0
    assert kept > 0  # multi-row verify windows shared passes too


def test_a_target_without_batches_runs_one_sequence_per_pass(hybrid_targets):
    target = hybrid_targets("qwen3_next")
    generator = drafting_generator(target)
    problems, stats, _ = compare_with_alone(generator, REQUESTS[:3])
    assert not problems, problems[:5]
    if not capabilities_of(target).batches_sequences:
        assert set(stats.sequences_per_pass) == {1}


def test_negative_control_shared_passes_on_a_row_count_dependent_backend(inexact_targets):
    """With unpadded MKL matmuls and SDPA, a row's bits follow the pass's row count: the
    comparison above finds it."""
    generator = drafting_generator(inexact_targets("llama"), guard=False)
    problems, stats, _ = compare_with_alone(generator, [(p, dict(s, drafts=False))
                                                        for p, s in REQUESTS])
    assert max(stats.sequences_per_pass) >= 3
    assert any(p.startswith(("context ending", "two rows")) for p in problems), problems


def test_sample_seeds_are_derived_and_each_replays_alone(tiny_targets):
    generator = xd.Generator(tiny_targets["qwen3"])
    with Engine(generator) as engine:
        results = engine.generate_batch([PROMPTS[0], PROMPTS[1]], n=3, max_new_tokens=10,
                                        temperature=1.0, seed=11, stop_tokens=[])
    seeds = [r.seed for r in results]
    assert seeds[:3] == seeds[3:] == [11, sample_seed(11, 1), sample_seed(11, 2)]
    assert len(set(seeds)) == 3 and len({tuple(r.tokens) for r in results[:3]}) == 3
    for index, result in enumerate(results):
        alone = generator.generate(PROMPTS[index // 3], 10, temperature=1.0, seed=result.seed,
                                   stop_tokens=[])
        assert alone.tokens == result.tokens


def test_async_streams_deliver_every_chunk_in_order(tiny_targets):
    generator = xd.Generator(tiny_targets["llama"], xd.PromptLookup(max_draft=3, min_match=1),
                             adaptive_depth=False)

    async def collect(engine, prompt, seed):
        tokens, last = [], None
        async for chunk in engine.stream(prompt, max_new_tokens=16, temperature=0.8, seed=seed,
                                         stop_tokens=[]):
            tokens.extend(chunk.tokens)
            last = chunk
        return tokens, last.result

    async def main(engine):
        return await asyncio.gather(*(collect(engine, p, seed) for seed, p in enumerate(PROMPTS)))

    with Engine(generator) as engine:
        streamed = asyncio.run(main(engine))
    for seed, (prompt, (tokens, result)) in enumerate(zip(PROMPTS, streamed)):
        assert tokens == result.tokens
        assert tokens == generator.generate(prompt, 16, temperature=0.8, seed=seed,
                                            stop_tokens=[]).tokens


def test_a_cancelled_request_leaves_and_the_others_are_unchanged(tiny_targets):
    generator = xd.Generator(tiny_targets["llama"])
    with Engine(generator, max_sequences=2) as engine:
        long = engine.submit(PROMPTS[1], max_new_tokens=200, seed=1, stop_tokens=[])
        events = long.events(timeout=60)
        next(events)
        long.cancel()
        other = engine.submit(PROMPTS[0], max_new_tokens=20, seed=2, stop_tokens=[])
        result = other.results(timeout=60)[0]
        partial = long.results(timeout=60)[0]
        assert engine.load == (0, 0)
    assert partial.finish_reason == "interrupted" and len(partial.tokens) < 200
    assert result.tokens == generator.generate(PROMPTS[0], 20, seed=2, stop_tokens=[]).tokens


def test_a_full_queue_is_refused_and_bad_requests_are_named(tiny_targets):
    generator = xd.Generator(tiny_targets["llama"])
    with Engine(generator, max_sequences=1, max_waiting=1) as engine:
        with pytest.raises(xd.ParameterError, match="top_p"):
            engine.submit(PROMPTS[0], top_p=2.0)
        with pytest.raises(xd.ParameterError, match="n must be"):
            engine.submit(PROMPTS[0], n=5)
        first = engine.submit(PROMPTS[0], max_new_tokens=300, stop_tokens=[], seed=1)
        next(first.events(timeout=60))  # running: it left the queue
        engine.submit(PROMPTS[1], max_new_tokens=5, seed=1)
        with pytest.raises(xd.engine.QueueFull, match="max_waiting=1"):
            engine.submit(PROMPTS[2], max_new_tokens=5, seed=1)
        first.cancel()


def tree_generator(target, sampler=None, **options):
    return xd.Generator(target, xd.PromptLookup(max_draft=4, min_match=1, tree_width=2),
                        sampler=sampler or ContextRows(), adaptive_depth=False, **options)


@pytest.mark.parametrize("variant", ["llama", "qwen3"])
def test_token_trees_in_shared_passes_equal_samples_alone(variant, tiny_targets):
    """A drafter that proposes trees: each sample's tree is verified in the shared pass (its
    rows see their own ancestors only) and every sample writes what it writes alone."""
    generator = tree_generator(tiny_targets[variant])
    assert generator.trees
    problems, stats, kept = compare_with_alone(generator)
    assert not problems, problems[:5]
    _, results, _ = run_together(generator)
    assert sum(r.stats.tree_passes for samples in results for r in samples) > 0
    assert max(stats.sequences_per_pass) >= 3 and kept > 0


class ChainsOnly:
    """Mixed into a target's class: its passes drop the trees' parents (a tree's rows then see
    every row before them, siblings included), as a pass without tree attention would."""

    def forward_batch(self, states, token_lists, rows="last", features=False, parents=None):
        if parents is not None:
            for state, tree in zip(states, parents):
                if tree is not None:
                    state.tree = (state.cache.length, list(tree))
        return super().forward_batch(states, token_lists, rows, features)


@pytest.mark.parametrize("broken", [False, True])
def test_oracle_trees_in_shared_passes(broken, tiny_targets):
    """Trees that hold the serial continuation on one branch and siblings around it, verified
    in passes shared with other samples, write the serial tokens, and keep nodes at every
    depth; negative control: a target whose passes drop the parents (guard off, since the
    guard turns such trees off) writes other tokens."""
    target = tiny_targets["llama"]
    if broken:
        target = copy.copy(target)
        target.__class__ = type("ChainsOnlyTarget", (ChainsOnly, type(target)), {})
    prompt, options = PROMPTS[1], dict(max_new_tokens=24, temperature=0.9, seed=8)
    serial = xd.Generator(tiny_targets["llama"]).generate(prompt, stop_tokens=[], **options)
    drafter = OracleTreeDrafter(serial.tokens, len(prompt), seed=2)
    generator = xd.Generator(target, drafter, adaptive_depth=False, guard=False)
    assert generator.trees
    with Engine(generator, max_sequences=4) as engine:
        first = engine.submit(prompt, stop_tokens=[], **options)  # it holds the drafter
        others = [engine.submit(p, stop_tokens=[], max_new_tokens=20, temperature=0.7, seed=i)
                  for i, p in enumerate(PROMPTS[2:])]
        result = first.results(timeout=120)[0]
        for submission in others:
            submission.results(timeout=120)
        shared = max(engine.stats.sequences_per_pass)
    assert result.stats.tree_passes > 0 and shared >= 2
    if broken:
        assert result.tokens != serial.tokens
    else:
        assert result.tokens == serial.tokens and result.stats.accepted > 0
