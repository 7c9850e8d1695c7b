"""Scoring: logprobs of given tokens from prefill passes equal, bit for bit, the logprobs the
same tokens got when decoded one by one (serial and drafted, with filters and penalties, across
prefill-chunk edges); a target whose multi-row passes differ from single steps (the negative
control) gives other bits, which shows the comparison can fail."""

from __future__ import annotations

import math

import pytest

import exactdraft as xd
from exactdraft.errors import ParameterError
from exactdraft.scoring import score, token_logprobs
from tests.conftest import needs_smollm2

PROMPT = [5, 9, 17, 3, 3, 40, 41, 9, 17, 3, 60, 2, 7]


def bits(entries) -> list:
    """Token, logprob bytes and top alternatives' bytes of each entry."""
    return [(e.token, float(e.logprob).hex(), tuple((t, float(lp).hex()) for t, lp in e.top))
            for e in entries]


@pytest.fixture(scope="module")
def generator(tiny_checkpoints):
    # A small prefill chunk, so the scored tokens cross several pass edges.
    return xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch", prefill_chunk=5,
                                        drafter=xd.PromptLookup(max_draft=4, min_match=1),
                                        progress=False)


SETTINGS = [dict(temperature=0.8, seed=3),
            dict(temperature=1.0, top_k=20, top_p=0.9, seed=4),
            dict(temperature=0.7, repetition_penalty=1.3, presence_penalty=0.5,
                 frequency_penalty=0.2, seed=5),
            dict(temperature=0, logit_bias={2: -5.0})]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("drafts", [False, True])
def test_scores_equal_decoded_logprobs_bit_for_bit(generator, settings, drafts) -> None:
    result = generator.generate(PROMPT, max_new_tokens=24, drafts=drafts, logprobs=3,
                                **settings)
    assert len(result.tokens) >= 8
    scored = token_logprobs(generator, PROMPT + result.tokens, start=len(PROMPT), top=3,
                            **{k: v for k, v in settings.items() if k != "seed"})
    assert bits(scored) == bits(result.logprobs)
    assert bits(score(generator, PROMPT, result.tokens, top=3, **settings)) == \
        bits(result.logprobs)


def test_a_score_does_not_depend_on_what_follows_or_on_chunk_edges(generator) -> None:
    """A prompt token's score equals its score with nothing after it, where the pass edges
    fall elsewhere."""
    scored = score(generator, PROMPT, temperature=0.9, top=2)
    assert [e.token for e in scored] == PROMPT[1:]
    for i in (1, 4, 5, 11):  # around the chunk edges at 5 and 10
        alone = token_logprobs(generator, PROMPT[:i + 1], start=i, temperature=0.9, top=2)
        assert bits(alone) == bits([scored[i - 1]])


def test_a_filtered_token_scores_minus_infinity(generator) -> None:
    greedy = score(generator, PROMPT, temperature=0, top=1)
    kept = score(generator, PROMPT, temperature=1.0, top_k=1, top=1)
    for plain, filtered in zip(greedy, kept):
        if plain.top[0][0] == plain.token:
            assert filtered.logprob == 0.0
        else:
            assert filtered.logprob == -math.inf and filtered.top[0][0] == plain.top[0][0]
    assert any(f.logprob == -math.inf for f in kept)


def test_rows_that_are_not_invariant_give_other_scores(tiny_checkpoints,
                                                       one_torch_thread) -> None:
    """Negative control: on a target whose multi-row passes differ from single steps by ulps
    (split-K products, guard off), prefill scores differ from the decoded logprobs."""
    from exactdraft.pretrained import build_target, load_checkpoint
    from tests.inexact import InexactTorchBackend

    target = build_target(load_checkpoint(tiny_checkpoints["llama"]),
                          InexactTorchBackend(split_k=True))
    inexact = xd.Generator(target, guard=False, prefill_chunk=64)
    result = inexact.generate(PROMPT, max_new_tokens=24, drafts=False, logprobs=0,
                              temperature=0.8, seed=3)
    scored = token_logprobs(inexact, PROMPT + result.tokens, start=len(PROMPT),
                            temperature=0.8)
    assert [e.token for e in scored] == result.tokens
    assert bits(scored) != bits(result.logprobs)


@pytest.mark.parametrize("call, name", [
    (lambda g: token_logprobs(g, PROMPT, start=0), "start"),
    (lambda g: token_logprobs(g, PROMPT, start=len(PROMPT) + 1), "start"),
    (lambda g: token_logprobs(g, [1, 10**6]), "10000"),
    (lambda g: token_logprobs(g, PROMPT, top=21), "top"),
    (lambda g: token_logprobs(g, PROMPT, n_prompt=-1), "n_prompt"),
    (lambda g: token_logprobs(g, PROMPT, temprature=1), "temprature"),
    (lambda g: token_logprobs(g, "text"), "tokens"),
    (lambda g: token_logprobs(g, [1] * 5000), "context"),
])
def test_bad_arguments_are_named(generator, call, name) -> None:
    with pytest.raises(ParameterError, match=name):
        call(generator)


@needs_smollm2
def test_smollm2_scores_equal_decoded_logprobs() -> None:
    """The same on the bundled SmolLM2 (quantized, the CPU kernels), chat prompt, drafted."""
    generator = xd.Generator.from_pretrained(drafter=xd.PromptLookup(), progress=False)
    chat = [{"role": "user", "content": "List three colours, then the same three again."}]
    result = generator.generate(chat, max_new_tokens=20, logprobs=2, temperature=0.7, seed=1)
    scored = score(generator, chat, result.tokens, top=2, temperature=0.7)
    assert bits(scored) == bits(result.logprobs)
