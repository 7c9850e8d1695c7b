"""The draft head bundled for SmolLM2-135M-Instruct (exactdraft/data/heads/smollm2): it loads
for the bundled checkpoint, drafts exactly, and some of its drafts are kept."""

from __future__ import annotations

import pytest

import exactdraft as xd
from tests.conftest import needs_smollm2
from tests.drafters.test_fallback import CountingFallback
from tests.exactness import ExactnessCheck

pytestmark = needs_smollm2


def test_the_bundled_head_drafts_exactly(smollm2):
    target, tokenizer = smollm2
    head = xd.DraftHead.from_pretrained(None, target)
    assert head.weights.config.target_name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    generator = xd.Generator(target, head, tokenizer=tokenizer, adaptive_depth=False)
    check = ExactnessCheck()
    messages = [{"role": "user", "content": "Explain how a hash table works."}]
    for seed, temperature in enumerate((0.0, 0.7)):
        params = xd.SamplingParams(temperature=temperature, seed=seed)
        check.compare(generator, messages, 32, params, stop_tokens=[])
    check.assert_exact(min_accepted=4)


def test_lookup_then_the_bundled_head_drafts_exactly(smollm2):
    """A reply that copies part of its prompt: lookup drafts the copy, the head the rest, and
    every committed token is the serial run's."""
    target, tokenizer = smollm2
    drafter = CountingFallback(xd.PromptLookup(), xd.DraftHead.from_pretrained(None, target))
    generator = xd.Generator(target, drafter, tokenizer=tokenizer, adaptive_depth=False)
    check = ExactnessCheck()
    messages = [{"role": "user", "content": "Repeat this line twice, then explain it: the quick "
                                            "brown fox jumps over the lazy dog."}]
    for seed, temperature in enumerate((0.0, 0.7)):
        params = xd.SamplingParams(temperature=temperature, seed=seed)
        check.compare(generator, messages, 48, params, stop_tokens=[])
    check.assert_exact(min_accepted=4)
    assert min(drafter.verified) > 0, drafter.verified


def test_the_bundled_head_is_refused_for_other_weights(smollm2, tiny_targets):
    with pytest.raises(xd.CheckpointError, match="trained for another target"):
        xd.DraftHead.from_pretrained(xd.DraftHead.from_pretrained(None, smollm2[0]).source,
                                     tiny_targets["llama"])


def test_from_pretrained_builds_a_head_from_a_factory_and_the_cli_names_it(capsys):
    """drafter= may be a function of the target (a head needs the target first); the result
    drafts and writes the serial tokens. A factory that returns no drafter is refused."""
    from exactdraft.cli import main

    generator = xd.Generator.from_pretrained(
        None, drafter=lambda target: xd.DraftHead.from_pretrained(None, target), progress=False)
    assert isinstance(generator.drafter, xd.DraftHead)
    messages = [{"role": "user", "content": "Name three colours."}]
    drafted = generator.generate(messages, max_new_tokens=16, temperature=0.7, seed=3)
    serial = generator.generate(messages, max_new_tokens=16, temperature=0.7, seed=3,
                                drafts=False)
    assert drafted.tokens == serial.tokens and drafted.stats.drafted > 0
    with pytest.raises(xd.ParameterError, match="drafter"):
        xd.Generator.from_pretrained(None, drafter=lambda target: 42, progress=False)
    for spec in ("head", "lookup+head"):
        assert main(["generate", "--chat", "Name three colours.", "--drafter", spec,
                     "--max-new-tokens", "12", "--temperature", "0", "--compare"]) == 0
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[-1].startswith("identical: yes"), lines
        assert any(line.startswith("drafted [") and "tokens/pass" in line for line in lines)


def test_the_head_drafts_in_the_engine(smollm2):
    """Engine passes hand the target's features to the sample drafting with the head: it drafts
    there too, and every sample writes the tokens it writes alone (negative control: another
    seed writes other tokens)."""
    from exactdraft.engine import Engine

    target, tokenizer = smollm2
    generator = xd.Generator(target, xd.DraftHead.from_pretrained(None, target),
                             tokenizer=tokenizer, adaptive_depth=False)
    prompts = [[{"role": "user", "content": text}] for text in
               ("Explain how a hash table works.", "Name three colours.", "What is rain?")]
    options = dict(max_new_tokens=24, temperature=0.7, stop_tokens=[])
    alone = [generator.generate(p, seed=i, **options) for i, p in enumerate(prompts)]
    with Engine(generator, max_sequences=3) as engine:
        submissions = [engine.submit(p, seed=i, **options) for i, p in enumerate(prompts)]
        together = [s.results()[0] for s in submissions]
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert sum(r.stats.drafted for r in together) > 0
    assert generator.generate(prompts[0], seed=99, **options).tokens != alone[0].tokens
