"""DraftHead: drafted == serial with a trained head across the sampling space, its guesses are
the keyed samples of its own logits, it follows the commits, its files round-trip, and a head
for other weights is refused.

The heads are trained here on the tiny targets, a few seconds each: too little training to
draft well, enough that some drafts are kept (the checks below require it)."""

from __future__ import annotations

import numpy as np
import pytest

import exactdraft as xd
from exactdraft import CheckpointError, DraftContext, DraftHead, KeyedSampler, SamplingParams
from exactdraft.drafters.base import DraftTree
from exactdraft.drafters.head_model import HeadWeights
from exactdraft.training import TrainingSettings, train_draft_head
from tests.exactness import ExactnessCheck

TINY_TRAINING = TrainingSettings(epochs=3, max_new_tokens=24, samples=1, draft_vocab=96,
                                 prompt_limit=12, batch_size=4, validation=2, warmup_steps=2,
                                 learning_rate=3e-3, store_dtype="float32")
TEMPERATURES = [0.0, 0.3, 0.7, 1.0, 1.5]
FILTERS = {
    "plain": {},
    "top_k": dict(top_k=5),
    "top_p": dict(top_p=0.8),
    "penalties": dict(repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2),
    "combined": dict(top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                     logit_bias={7: 1.5, 9: -2.0}),
}
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [3, 17, 99, 3, 17, 99, 3, 17],
           list(range(60, 90))]


def train_heads(targets, checkpoints, variants, tmp_path_factory) -> dict[str, str]:
    """variant -> folder of a head trained (TINY_TRAINING) for targets(variant)."""
    from exactdraft.pretrained import load_checkpoint

    folders = {}
    for variant in variants:
        folder = str(tmp_path_factory.mktemp(f"head-{variant}"))
        tokenizer = load_checkpoint(checkpoints[variant]).tokenizer
        train_draft_head(xd.Generator(targets(variant), tokenizer=tokenizer), folder,
                         TINY_TRAINING, progress=False)
        folders[variant] = folder
    return folders


@pytest.fixture(scope="module")
def head_folders(tiny_targets, tiny_checkpoints, tmp_path_factory):
    """variant -> folder of a head trained for tiny_targets[variant]."""
    return train_heads(tiny_targets.__getitem__, tiny_checkpoints, ("llama", "gemma3"),
                       tmp_path_factory)


def head_for(tiny_targets, head_folders, variant, max_draft=4):
    return DraftHead.from_pretrained(head_folders[variant], tiny_targets[variant],
                                     max_draft=max_draft)


@pytest.mark.parametrize("filter_name", sorted(FILTERS))
def test_drafted_equals_serial_with_the_head(tiny_targets, head_folders, filter_name):
    target = tiny_targets["llama"]
    serial = xd.Generator(target)
    check = ExactnessCheck()
    for temperature in TEMPERATURES:
        for seed in range(2):
            params = SamplingParams(temperature=temperature, seed=seed, **FILTERS[filter_name])
            prompt = PROMPTS[seed % len(PROMPTS)]
            head = head_for(tiny_targets, head_folders, "llama", max_draft=1 + seed * 3)
            drafted = xd.Generator(target, head, adaptive_depth=False)
            check.compare(drafted, prompt, 24, params, serial=serial, stop_tokens=[],
                          label=f"t={temperature} seed {seed}")
    check.assert_exact(min_accepted=3, some_rejected=True)


def test_drafted_equals_serial_on_tied_scaled_gemma(tiny_targets, head_folders):
    target = tiny_targets["gemma3"]
    head = head_for(tiny_targets, head_folders, "gemma3")
    drafted, serial = xd.Generator(target, head, adaptive_depth=False), xd.Generator(target)
    check = ExactnessCheck()
    for seed, temperature in enumerate((0.0, 0.7, 1.0)):
        params = SamplingParams(temperature=temperature, top_p=0.95, seed=seed)
        check.compare(drafted, PROMPTS[2] * 2, 30, params, serial=serial, stop_tokens=[])
    check.assert_exact(min_accepted=1)


def context(params, n_prompt):
    return DraftContext(params=params, sampler=KeyedSampler(), n_prompt=n_prompt)


def features_of(target, tokens):
    return target.forward(target.new_state(), tokens, features=True)[1]


def test_guesses_are_keyed_samples_of_the_heads_logits(tiny_targets, head_folders):
    target = tiny_targets["llama"]
    head = head_for(tiny_targets, head_folders, "llama")
    params = SamplingParams(temperature=0.9, seed=5)
    sequence = PROMPTS[0]
    head.begin(sequence, context(params, len(sequence)))
    assert head.propose(sequence, 3) == []  # no features yet: a serial step
    head.observe(features_of(target, sequence[:-1]), 0)
    drafts = head.propose(sequence, 3)
    assert len(drafts) == 3 and set(drafts) <= set(head.draft_ids.tolist())
    # The first guess, by hand: head rows 1..n-1, then the keyed draw over the head's
    # DRAW_CANDIDATES most probable draft tokens, every other token banned.
    from exactdraft.drafters.head import DRAW_CANDIDATES
    from exactdraft.drafters.head_model import HeadCache, head_rows

    rows = head_rows(head.weights, HeadCache(head.weights.config),
                     target.embedding_rows(sequence[1:]), features_of(target, sequence[:-1]),
                     np.arange(1, len(sequence)), head.linear)
    logits = head.logits(rows[-1:])[0]
    assert len(logits) > DRAW_CANDIDATES  # the cut is tested, not skipped
    top = np.argsort(-logits, kind="stable")[:DRAW_CANDIDATES]
    full = np.full(target.vocab_size, -1e9, dtype=np.float32)
    full[head.draft_ids[top]] = logits[top]
    assert drafts[0] == KeyedSampler().sample(full, params, pos=len(sequence), history=sequence,
                                              n_prompt=len(sequence))


def test_the_head_follows_the_commits(tiny_targets, head_folders):
    """After a partly kept proposal the head drafts what a fresh head given the same
    committed sequence and features drafts."""
    target = tiny_targets["llama"]
    params = SamplingParams(temperature=0.8, seed=2)
    prompt = PROMPTS[1]
    head = head_for(tiny_targets, head_folders, "llama")
    head.begin(prompt, context(params, len(prompt)))
    head.observe(features_of(target, prompt[:-1]), 0)
    first = head.propose(prompt, 4)
    committed = prompt + first[:2] + [(first[2] + 1) % target.vocab_size]
    # The verify pass over [prompt[-1], first...] kept prompt[-1] and two drafts.
    head.observe(features_of(target, committed[:-1])[len(prompt) - 1:], len(prompt) - 1)
    again = head.propose(committed, 3)
    fresh = head_for(tiny_targets, head_folders, "llama")
    fresh.begin(prompt, context(params, len(prompt)))
    fresh.observe(features_of(target, committed[:-1]), 0)
    assert again == fresh.propose(committed, 3)
    assert head.propose(committed, 3) == again  # asked twice: the same guesses


def test_saved_and_loaded_heads_draft_alike(tiny_targets, head_folders, tmp_path):
    target = tiny_targets["llama"]
    head = head_for(tiny_targets, head_folders, "llama")
    params = SamplingParams(temperature=0.7, seed=9)
    prompt = PROMPTS[2]

    def drafts(drafter):
        drafter.begin(prompt, context(params, len(prompt)))
        drafter.observe(features_of(target, prompt[:-1]), 0)
        return drafter.propose(prompt, 4)

    head.save_pretrained(tmp_path / "f32", dtype="float32")
    loaded = DraftHead.from_pretrained(tmp_path / "f32", target)
    for name, value in head.weights.tensors.items():
        assert loaded.weights.tensors[name].tobytes() == value.tobytes(), name
    assert drafts(loaded) == drafts(head)
    head.save_pretrained(tmp_path / "f16")  # float16 by default
    half = [DraftHead.from_pretrained(tmp_path / "f16", target) for _ in range(2)]
    assert drafts(half[0]) == drafts(half[1])
    assert (tmp_path / "f16" / "head.safetensors").stat().st_size < \
        (tmp_path / "f32" / "head.safetensors").stat().st_size * 0.6


def test_a_head_for_another_target_is_refused(tiny_targets, head_folders):
    with pytest.raises(CheckpointError, match="trained for another target"):
        DraftHead.from_pretrained(head_folders["llama"], tiny_targets["qwen2"])
    with pytest.raises(CheckpointError, match="no draft head is bundled"):
        DraftHead.from_pretrained(None, tiny_targets["llama"])
    with pytest.raises(CheckpointError, match="config.json"):
        DraftHead.from_pretrained(head_folders["llama"] + "-missing", tiny_targets["llama"])


def test_a_damaged_head_file_is_named(tiny_targets, head_folders, tmp_path):
    weights = HeadWeights.load(head_folders["llama"])
    weights.save(tmp_path)
    (tmp_path / "head.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="head.safetensors"):
        DraftHead.from_pretrained(tmp_path, tiny_targets["llama"])


def test_a_head_whose_observe_raises_costs_nothing(tiny_targets, head_folders):
    class Broken(DraftHead):
        def observe(self, features, start):
            raise RuntimeError("broken")

    target = tiny_targets["llama"]
    broken = Broken(target, HeadWeights.load(head_folders["llama"]))
    params = SamplingParams(temperature=0.5, seed=1)
    with pytest.warns(RuntimeWarning, match="observe"):
        result = xd.Generator(target, broken).generate(PROMPTS[0], 12, params, stop_tokens=[])
    serial = xd.Generator(target).generate(PROMPTS[0], 12, params, stop_tokens=[])
    assert result.tokens == serial.tokens and result.stats.drafted == 0
    assert set(result.stats.drafter_faults.counts) == {"raised"}


def test_the_engine_hands_the_head_its_features(tiny_targets, head_folders):
    """Engine passes carry the target's features to a head-drafting sample: it drafts there,
    and writes the serial tokens."""
    from exactdraft.engine import Engine

    target = tiny_targets["llama"]
    generator = xd.Generator(target, head_for(tiny_targets, head_folders, "llama"),
                             adaptive_depth=False)  # every draft verified: drafts surely run
    params = SamplingParams(temperature=0.7, seed=4)
    with Engine(generator, max_sequences=2) as engine:
        result = engine.generate_batch([PROMPTS[0]], max_new_tokens=16, sampling=params,
                                       stop_tokens=[])[0]
    serial = xd.Generator(target).generate(PROMPTS[0], 16, params, stop_tokens=[])
    assert result.tokens == serial.tokens and result.stats.drafted > 0


def test_bad_arguments(tiny_targets, head_folders):
    weights = HeadWeights.load(head_folders["llama"])
    with pytest.raises(xd.ParameterError, match="max_draft"):
        DraftHead(tiny_targets["llama"], weights, max_draft=0)
    head = DraftHead(tiny_targets["llama"], weights)
    with pytest.raises(xd.ParameterError, match="features must be"):
        head.observe(np.zeros((2, 3), np.float32), 0)


def test_the_weight_formats_compute_the_same_head(tiny_targets, head_folders):
    """The head's products on the backend (f32, q8_0 blocks) agree with the numpy reference
    up to rounding (f32) and quantization (q8_0), and each drafts exactly."""
    from exactdraft.drafters.head_model import HeadCache, head_rows

    target = tiny_targets["llama"]
    sequence = PROMPTS[2]
    rows = {}
    for weights_format in ("numpy", "f32", "q8_0"):
        head = DraftHead.from_pretrained(head_folders["llama"], target,
                                         weights_format=weights_format)
        out = head_rows(head.weights, HeadCache(head.weights.config),
                        target.embedding_rows(sequence[1:]), features_of(target, sequence[:-1]),
                        np.arange(1, len(sequence)), head.linear)
        rows[weights_format] = head.logits(out)
        check = ExactnessCheck()
        check.compare(xd.Generator(target, head, adaptive_depth=False), sequence, 20,
                      SamplingParams(temperature=0.0), serial=xd.Generator(target),
                      stop_tokens=[])
        check.assert_exact(min_accepted=0)
        assert check.drafted > 0
    np.testing.assert_allclose(rows["f32"], rows["numpy"], atol=1e-3)
    scale = np.abs(rows["numpy"]).max()
    assert np.abs(rows["q8_0"] - rows["numpy"]).max() < 0.05 * scale
    with pytest.raises(xd.ParameterError, match="weights_format"):
        DraftHead.from_pretrained(head_folders["llama"], target, weights_format="q4")


def test_a_head_proposing_trees_writes_the_serial_tokens(tiny_targets, head_folders):
    """tree_width=3: each depth holds the head's keyed guess and two alternatives, verified in
    one tree pass; drafted == serial, tokens and logprobs, with tree passes and kept drafts;
    with and without the adaptive policy choosing the nodes. (Tree passes sample outside the
    verifier, so the comparison is of the runs' tokens and logprobs, not of recorded rows.)"""
    target = tiny_targets["llama"]
    tree_passes = accepted = 0
    for adaptive in (False, True):
        for temperature in TEMPERATURES:
            for seed in range(2):
                head = DraftHead.from_pretrained(head_folders["llama"], target, max_draft=6,
                                                 tree_width=3)
                generator = xd.Generator(target, head, adaptive_depth=adaptive)
                assert generator.trees, generator.tree_note
                options = dict(temperature=temperature, seed=seed, top_k=10 * seed,
                               logprobs=2, stop_tokens=[])
                drafted = generator.generate(PROMPTS[seed], 24, **options)
                serial = generator.generate(PROMPTS[seed], 24, drafts=False, **options)
                assert drafted.tokens == serial.tokens, (temperature, seed, adaptive)
                assert drafted.logprobs == serial.logprobs, (temperature, seed, adaptive)
                tree_passes += drafted.stats.tree_passes
                accepted += drafted.stats.accepted
    assert tree_passes > 0 and accepted >= 3, (tree_passes, accepted)


def test_a_head_tree_holds_the_guess_and_its_alternatives(tiny_targets, head_folders):
    target = tiny_targets["llama"]
    head = DraftHead.from_pretrained(head_folders["llama"], target, max_draft=5, tree_width=2)
    chain = DraftHead.from_pretrained(head_folders["llama"], target, max_draft=5)
    tokens = PROMPTS[0]
    params = SamplingParams(temperature=0.0)
    for drafter in (head, chain):
        drafter.begin(tokens, context(params, len(tokens)))
        drafter.observe(features_of(target, tokens[:-1]), 0)
    tree, guesses = head.propose(tokens, 5), chain.propose(tokens, 5)
    assert isinstance(tree, DraftTree) and len(tree) == 5
    assert tree.parents == (-1, -1, 0, 0, 2)  # guess, alternative; guess, alternative; guess
    assert list(tree.first_path()) == guesses[:3]
    assert tree.tokens[1] != tree.tokens[0] and tree.tokens[3] != tree.tokens[2]
    with pytest.raises(xd.ParameterError, match="tree_width"):
        DraftHead.from_pretrained(head_folders["llama"], target, tree_width=0)


def test_negative_control_head_trees_on_a_target_that_ignores_parents(tiny_targets,
                                                                      head_folders):
    """The same comparison fails where the tree pass lets a row see its siblings (guard off)."""
    from tests.test_tree_generation import ChainTreeTarget

    class ChainTreeTargetWithFeatures(ChainTreeTarget):
        def forward_tree(self, state, tokens, parents, features=False):
            start = state.cache.length
            out = self._target.forward(state, tokens, rows="all", features=features)
            state.tree = (start, list(parents))
            return out

    target = ChainTreeTargetWithFeatures(tiny_targets["llama"])
    differing = 0
    for temperature in TEMPERATURES:
        for seed in range(2):
            head = DraftHead.from_pretrained(head_folders["llama"], tiny_targets["llama"],
                                             max_draft=6, tree_width=3)
            generator = xd.Generator(target, head, adaptive_depth=False, guard=False)
            assert generator.trees
            options = dict(temperature=temperature, seed=seed, stop_tokens=[])
            drafted = generator.generate(PROMPTS[seed], 24, **options)
            serial = generator.generate(PROMPTS[seed], 24, drafts=False, **options)
            differing += drafted.tokens != serial.tokens
    assert differing > 0


def test_the_block_is_one_layer_kernel_call_computing_head_rows(tiny_targets, head_folders):
    """On the CPU kernels the head's block runs as one call of the target's layer kernel: its
    rows are the numpy computation's up to float rounding, and being row invariant, rows
    computed in one call have the bits of the same rows computed in two (the cache carries
    the first call's keys); negative control: other positions (rope) change the rows."""
    from exactdraft.drafters.head_model import HeadCache, head_rows

    target = tiny_targets["llama"]
    fused = DraftHead.from_pretrained(head_folders["llama"], target, weights_format="f32")
    assert fused.block is not None
    assert DraftHead.from_pretrained(head_folders["llama"], target,
                                     weights_format="numpy").block is None
    tokens = PROMPTS[0][:7]
    embeddings = target.embedding_rows(tokens)
    features = features_of(target, tokens)
    positions = np.arange(1, 8)
    block = fused.block
    whole = block.rows(block.new_cache(), embeddings, features, positions)
    cache = block.new_cache()
    parts = np.concatenate([block.rows(cache, embeddings[:5], features[:5], positions[:5]),
                            block.rows(cache, embeddings[5:], features[5:], positions[5:])])
    assert whole.tobytes() == parts.tobytes()
    reference = head_rows(fused.weights, HeadCache(fused.weights.config), embeddings, features,
                          positions)
    assert np.abs(whole - reference).max() <= 1e-4 * np.abs(reference).max()
    moved = block.rows(block.new_cache(), embeddings, features, positions + 3)
    assert moved.tobytes() != whole.tobytes()


def test_most_probable_is_the_largest_logits():
    """The head's cut is the `count` largest logits, whatever the length (shorter, equal,
    longer, not a multiple of the blocks) and however the large ones cluster."""
    from exactdraft.drafters.head import most_probable

    rng = np.random.default_rng(11)
    for n in (1, 63, 64, 65, 100, 257, 8192, 10007):
        for clustered in (False, True):
            logits = rng.permutation(n).astype(np.float32)
            if clustered:  # the largest all in the first block: the bound must still hold
                logits = np.sort(logits)[::-1].copy()
            top = most_probable(logits, 64)
            expected = np.sort(np.argsort(-logits, kind="stable")[:64])
            assert np.array_equal(top, expected), (n, clustered)
