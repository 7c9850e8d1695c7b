"""Gemma 4 GGUF tokenizers (tokenizer.ggml.model "gemma4") give the ids and text of the Hugging
Face tokenizer they were converted from.

The test builds a tiny Gemma 4 tokenizer with transformers' GemmaTokenizer (a BPE vocabulary
trained here, byte tokens, special and added tokens, a Gemma 4 style chat template), saves it as
a Hugging Face folder, and writes the GGUF tokenizer metadata from that folder as llama.cpp's
converter does for Gemma 4: gguf-py's LlamaHfVocab for tokens, scores and types (the tokens a
chat parser must see made user-defined), SpecialVocab for merges, special ids and the chat
template, model `gemma4`, no space prefix, bos added.
"""

from __future__ import annotations

import json

import pytest

from exactdraft.errors import TokenizerError
from exactdraft.loading.gemma4_vocabulary import gemma4_backend
from exactdraft.loading.gguf import read_gguf_metadata
from exactdraft.loading.tokenizer import Tokenizer

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>"]
# The converter makes these user-defined so that a chat parser sees them in the output.
VISIBLE = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
           "<tool_response|>", '<|"|>'}
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|turn>{{ m['role'] }}\n"
                 "{{ m['content'] }}<turn|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|turn>model\n{% endif %}")
LINES = ["the cat sat on the mat", "hello world, hello there", "the  end of the line",
         "naïve café déjà vu", "then they thought that the theme was there"]
TEXTS = [
    "the cat sat on the mat",
    "hello there, the world",
    "  leading spaces and trailing  ",
    "line one\nline two\n\nline four\n\n\n\nend",
    "\n\nthe\n",
    "naïve café 😀 中文 déjà",
    "<|turn>user\nhello<turn|>\n<|turn>model\n",
    "a <|channel>thought<channel|> b",
    "thethethe themes",
    "tab\tand\r\nreturn",
    "",
]


def _gemma4_folder(folder) -> str:
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, normalizers, trainers
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    trained = Backend(models.BPE(byte_fallback=True))
    trained.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(vocab_size=140, show_progress=False)
    # Newline runs are trained apart from the text, so no token mixes newlines with other
    # characters (llama.cpp merges newline runs and the rest separately).
    trained.train_from_iterator(LINES * 10 + ["\n", "\n\n", "\n\n\n"] * 10, trainer)
    model = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = {}
    for token in SPECIALS + [f"<0x{byte:02X}>" for byte in range(256)]:
        vocab[token] = len(vocab)
    # Ids in the reverse of the order training made the tokens, so that no reader ranking
    # merges by id (or by the converter's scores, all equal) can stumble on the merge order.
    for token in sorted(model["vocab"], key=model["vocab"].get, reverse=True):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(pair) for pair in model["merges"]]
    assert ("\n", "\n") in merges and len(merges) > 40
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|turn>", "<turn|>"]})
    tokenizer.add_tokens(["<|channel>", "<channel|>"])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["add_bos_token"] = True
    config_path.write_text(json.dumps(config))
    return str(folder)


def _gguf_file(folder: str, path, **changed) -> str:
    """The tokenizer metadata llama.cpp's converter writes for a Gemma 4 folder, with `changed`
    fields written in place of the converter's."""
    from pathlib import Path

    vocab = gguf.LlamaHfVocab(Path(folder))
    tokens, scores, types = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(gguf.TokenType.USER_DEFINED if text.decode() in VISIBLE else kind)
    writer = gguf.GGUFWriter(str(path), arch="gemma4")
    writer.add_tokenizer_model(changed.pop("model", "gemma4"))
    writer.add_token_list(changed.pop("tokens", tokens))
    writer.add_token_scores(scores)
    writer.add_token_types(changed.pop("types", types))
    special = gguf.SpecialVocab(Path(folder), load_merges=True)
    if "merges" in changed:
        special.merges = changed.pop("merges")
    special.add_to_gguf(writer)
    writer.add_add_space_prefix(False)
    writer.add_add_bos_token(True)
    assert not changed
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.fixture(scope="module")
def gemma4_files(tmp_path_factory):
    folder = _gemma4_folder(tmp_path_factory.mktemp("gemma4_tokenizer"))
    return folder, _gguf_file(folder, tmp_path_factory.mktemp("gguf") / "vocab.gguf")


def test_gguf_tokenizer_equals_the_folder_tokenizer(gemma4_files):
    folder, path = gemma4_files
    expected, actual = Tokenizer.from_folder(folder), Tokenizer.from_gguf(path)
    assert actual.vocab_size == expected.vocab_size
    assert (actual.bos_token, actual.eos_token, actual.add_bos) == ("<bos>", "<eos>", True)
    # A turn ends at <turn|>, read from the file as from the folder.
    end_of_turn = expected.backend.token_to_id("<turn|>")
    assert actual.stop_token_ids == expected.stop_token_ids == (expected.eos_token_id,
                                                                 end_of_turn)
    for text in TEXTS:
        ids = expected.encode(text)
        assert actual.encode(text) == ids, text
        assert actual.encode(text, add_special_tokens=False) == ids[1:], text
        for skip in (False, True):
            assert actual.decode(ids, skip_special_tokens=skip) == \
                expected.decode(ids, skip_special_tokens=skip), text
    # The fixture reaches what it claims to: merges, byte fallback, special and added tokens.
    pieces = expected.backend.encode(" ".join(TEXTS)).tokens
    assert {"<0xF0>", "<|turn>", "<|channel>", "\n\n"} <= set(pieces)
    assert any(len(piece) > 3 and not piece.startswith("<") for piece in pieces)


def test_gguf_chat_template_renders_and_tokenizes_like_the_folder(gemma4_files):
    folder, path = gemma4_files
    expected, actual = Tokenizer.from_folder(folder), Tokenizer.from_gguf(path)
    assert actual.chat_template == expected.chat_template == CHAT_TEMPLATE
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "hello there, the cat"},
                {"role": "assistant", "content": "the  mat\n\nthe end"}]
    rendered = actual.render_chat(messages)
    assert rendered == expected.render_chat(messages)
    assert rendered.startswith("<bos><|turn>system\n") and rendered.endswith("<|turn>model\n")
    ids = expected.encode(rendered, add_special_tokens=False)
    assert actual.encode(rendered, add_special_tokens=False) == ids
    turn = expected.backend.token_to_id("<|turn>")
    assert ids[0] == expected.bos_token_id and ids.count(turn) == 4
    assert actual.decode(ids) == rendered == expected.decode(ids)


def test_negative_control_the_same_vocabulary_read_by_scores_differs(gemma4_files, tmp_path):
    """The fixture strings tell tokenizers apart: the same file read as a SentencePiece-style
    vocabulary (ranked by the converter's scores, all -1000, instead of by merges) gives other
    ids, and so does the gemma4 reading with the merges in reverse order."""
    folder, path = gemma4_files
    expected = Tokenizer.from_folder(folder)
    by_scores = Tokenizer.from_gguf(_gguf_file(folder, tmp_path / "llama.gguf", model="llama"))
    assert any(by_scores.encode(text) != expected.encode(text) for text in TEXTS)
    merges = list(read_gguf_metadata(path)["tokenizer.ggml.merges"])
    reversed_file = _gguf_file(folder, tmp_path / "reversed.gguf", merges=merges[::-1])
    reversed_order = Tokenizer.from_gguf(reversed_file)
    assert any(reversed_order.encode(text) != expected.encode(text) for text in TEXTS)


def test_malformed_vocabulary_is_refused_by_field(gemma4_files, tmp_path):
    folder, path = gemma4_files
    metadata = read_gguf_metadata(path)
    merges = list(metadata["tokenizer.ggml.merges"])
    with pytest.raises(TokenizerError, match=r"tokenizer.ggml.merges entry 3 'nospace'"):
        Tokenizer.from_gguf(metadata | {"tokenizer.ggml.merges": merges[:3] + ["nospace"]})
    with pytest.raises(TokenizerError, match="entry 0 'zz9 e': 'zz9' is not in "
                                             "tokenizer.ggml.tokens"):
        Tokenizer.from_gguf(metadata | {"tokenizer.ggml.merges": ["zz9 e"]})
    with pytest.raises(TokenizerError, match="has no tokenizer.ggml.merges list"):
        Tokenizer.from_gguf({k: v for k, v in metadata.items() if k != "tokenizer.ggml.merges"})
    types = list(metadata["tokenizer.ggml.token_type"])
    with pytest.raises(TokenizerError, match="tokenizer.ggml.token_type has 5 entries"):
        Tokenizer.from_gguf(metadata | {"tokenizer.ggml.token_type": types[:5]})
    tokens = list(metadata["tokenizer.ggml.tokens"])
    with pytest.raises(TokenizerError, match=r"tokenizer.ggml.tokens: token '<eos>' appears "
                                             r"twice \(ids 1 and 2\)"):
        Tokenizer.from_gguf(metadata | {"tokenizer.ggml.tokens": tokens[:2] + ["<eos>"]
                                        + tokens[3:]})
    with pytest.raises(TokenizerError, match="no bos token"):
        Tokenizer.from_gguf({k: v for k, v in metadata.items()
                             if k != "tokenizer.ggml.bos_token_id"})
    # The same refusals from the backend builder, and a merge whose result is no token.
    with pytest.raises(TokenizerError, match=r"entry 0 'a b': 'ab' is not in"):
        gemma4_backend(["a", "b"], [1, 1], ["a b"])
