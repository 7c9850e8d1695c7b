"""Bad input found by trying it as a new user would: each is refused up front with one of
exactdraft's own errors naming the value, and the Generator stays usable."""

from __future__ import annotations

import pytest

import exactdraft as xd


@pytest.fixture(scope="module")
def generator(tiny_checkpoints):
    return xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch",
                                        xd.PromptLookup(min_match=1), progress=False)


@pytest.fixture
def usable(generator):
    """Asserts after the test that the generator still gives the same reply."""
    before = generator.generate("abcabc", 8, seed=1).tokens
    yield
    assert generator.generate("abcabc", 8, seed=1).tokens == before


@pytest.mark.parametrize("prompt,match", [
    ("ab\ud800cd", r"the prompt holds a lone surrogate '\\ud800' at character 2"),
    ("\udcff", r"lone surrogate '\\udcff' at character 0"),  # a byte decoded with surrogateescape
    ([{"role": "user", "content": "hi \udc80"}], r"message 0's content holds a lone surrogate"),
])
def test_a_lone_surrogate_is_named(generator, usable, prompt, match):
    with pytest.raises(xd.TokenizerError, match=match):
        generator.generate(prompt, 4)


def test_a_stop_string_with_a_lone_surrogate_is_named(generator, usable):
    with pytest.raises(xd.TokenizerError, match="stop string"):
        generator.generate("abc", 4, stop=["x\ud800"])


@pytest.mark.parametrize("bias,match", [
    ({5: 1e308}, r"logit_bias\[5\] must lie in"),
    ({5: -1e10}, r"logit_bias\[5\] must lie in"),
    ({5: float("nan")}, r"logit_bias\[5\] must be a finite number"),
    ({"5": 1.0}, "logit_bias key must be a token id"),
    ({10**6: 1.0}, "logit_bias token id 1000000 is outside the vocabulary"),
])
def test_logit_bias_is_checked_up_front(generator, usable, bias, match):
    with pytest.raises(xd.ParameterError, match=match):
        generator.generate("abc", 4, logit_bias=bias)
    with pytest.raises(xd.ParameterError, match=match):
        generator.generate("abc", 4, xd.SamplingParams(logit_bias=bias))


def test_the_largest_allowed_bias_generates(generator):
    forced = generator.generate("abc", 4, logit_bias={40: 1e9}, seed=0, stop_tokens=[])
    assert forced.tokens == [40, 40, 40, 40]
    banned = generator.generate("abc", 30, logit_bias={40: -1e9}, seed=0, stop_tokens=[])
    assert 40 not in banned.tokens


@pytest.mark.parametrize("stop_tokens,match", [
    ([2, 128], "stop token id 128 is outside the vocabulary .0, 128."),
    ([-1], "stop token id -1 is outside the vocabulary"),
    (["</s>"], "stop token '</s>' is not a token id"),
    (2, "stop_tokens must be a list of token ids"),
])
def test_stop_tokens_outside_the_vocabulary_are_refused(generator, usable, tiny_targets,
                                                        stop_tokens, match):
    with pytest.raises(xd.ParameterError, match=match):
        generator.generate("abc", 4, stop_tokens=stop_tokens)
    with pytest.raises(xd.ParameterError, match=match):
        xd.Generator(tiny_targets["llama"], stop_tokens=stop_tokens)


def test_stop_tokens_are_checked_by_from_pretrained_before_loading(tiny_checkpoints):
    with pytest.raises(xd.ParameterError, match="stop token id -4"):
        xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch", stop_tokens=[-4])
