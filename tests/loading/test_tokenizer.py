"""Tokenizer: ids and chat rendering identical to transformers for the SmolLM2 GGUF, exact decode
round trips, Hugging Face folder loading, message checks and the template sandbox."""

from __future__ import annotations

import json

import pytest

from exactdraft.errors import TokenizerError
from exactdraft.loading.tokenizer import Tokenizer

PARITY_TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n\n\nclass Point:\n\tx: int = 0\n",
    "    indented\n        more\n\t\ttabs\n",
    "trailing spaces   \n   leading spaces",
    "a\r\nb\rc\n\n\n",
    "naïve café, Übergröße, ≠ ∞ — “quotes” «guillemets»",
    "emoji 🐱🐶👩‍👩‍👧 and flags 🇫🇷",
    "中文文本，日本語のテキスト、한국어 텍스트",
    "Здравствуй, мир! Γειά σου Κόσμε! مرحبا بالعالم",
    "x = 123 + 45.6e-7; y=0xFF; z = [1,2,3]",
    "It's, I'm, we'll, they've, she'd, don't",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<file_sep>",
    "\u00a0non-breaking\u2009thin\u3000ideographic space",
    "",
    " ",
    "🙂",
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another, in 中文 🙂"}],
    [{"role": "user", "content": "line one\n  line two\n"},
     {"role": "assistant", "content": ""}],
]


@pytest.fixture(scope="module")
def tokenizer(smollm_checkpoint) -> Tokenizer:
    return smollm_checkpoint.tokenizer


def test_smollm2_special_ids(tokenizer):
    assert tokenizer.vocab_size == 49152
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert not tokenizer.add_bos
    # eos (<|im_end|>) first, then <|endoftext|>, the end-of-document token.
    assert tokenizer.stop_token_ids == (2, 0)


@pytest.mark.parametrize("text", PARITY_TEXTS)
def test_ids_match_transformers_and_decode_round_trips(tokenizer, hf_tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids == hf_tokenizer.encode(text, add_special_tokens=True)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids) == hf_tokenizer.decode(ids)


def test_chat_prompt_ids_match_transformers(tokenizer, hf_tokenizer):
    for messages in CONVERSATIONS:
        prompt = tokenizer.render_chat(messages)
        assert tokenizer.encode(prompt) == hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert tokenizer.decode(tokenizer.encode(prompt)) == prompt


def test_numbers_split_off_first_like_llama_cpp(tokenizer):
    # tokenizer.ggml.pre "smollm": llama.cpp (and SmolLM2's own tokenizer.json) split every
    # \p{N} character off before the GPT-2 pattern runs, so the whitespace before a number never
    # merges with it: a run of spaces stays one token "ĠĠ", and " ½" is "Ġ" then "½".
    # transformers' GGUF tokenizer skips that split and gives "Ġ", "Ġ" and "ĠÂ", "½" here, so
    # these texts are kept out of the parity set above.
    def piece(token: str) -> int:
        return tokenizer.backend.token_to_id(token)

    assert tokenizer.encode("a  1") == [piece("a"), piece("ĠĠ"), piece("1")]
    assert tokenizer.encode("12") == [piece("1"), piece("2")]
    assert tokenizer.encode("a ½") == [piece("a"), piece("Ġ"), *tokenizer.encode("½")]
    for text in ("x   12 \n  3", "½ ¾ ²³ ٣ ０"):
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_in_text_and_skipping(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"
    with pytest.raises(TokenizerError, match="49152"):
        tokenizer.decode([5, 49152])
    with pytest.raises(TokenizerError, match="bytes"):
        tokenizer.encode(b"bytes")


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_chat_rendering_matches_transformers(tokenizer, hf_tokenizer, generation_prompt):
    for messages in CONVERSATIONS:
        ours = tokenizer.render_chat(messages, add_generation_prompt=generation_prompt)
        reference = hf_tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False)
        assert ours == reference


@pytest.mark.parametrize("messages, message", [
    ([{"role": "robot", "content": "hi"}], "unknown role 'robot'"),
    ([{"role": "user", "content": 3}], "message 0 .user. needs string content"),
    ([{"role": "user"}], "needs string content, got None"),
    ([{"content": "hi"}], "unknown role None"),
    (["hello"], "message 0 must be a dict"),
    ("hello", "must be a list of dicts, got str"),
    ([{"role": "user", "content": "a"}, ("user", "b")], "message 1 must be a dict"),
])
def test_malformed_messages_are_named(tokenizer, messages, message):
    with pytest.raises(TokenizerError, match=message):
        tokenizer.render_chat(messages)


def test_missing_template_and_template_errors(tokenizer):
    plain = Tokenizer(tokenizer.backend, eos_token_id=2)
    with pytest.raises(TokenizerError, match="no chat template"):
        plain.render_chat([{"role": "user", "content": "hi"}])
    refusing = Tokenizer(tokenizer.backend, chat_template=(
        "{% if messages[0]['role'] != 'system' %}"
        "{{ raise_exception('a system message must come first') }}{% endif %}ok"))
    with pytest.raises(TokenizerError, match="a system message must come first"):
        refusing.render_chat([{"role": "user", "content": "hi"}])
    assert refusing.render_chat([{"role": "system", "content": "s"}]) == "ok"


@pytest.mark.parametrize("template", [
    "{{ messages.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__base__.__subclasses__() }}",
    "{% set _ = messages.append({'role': 'user', 'content': 'x'}) %}",
    "{% set _ = messages[0].update({'content': 'x'}) %}",
])
def test_templates_run_sandboxed(tokenizer, template):
    hostile = Tokenizer(tokenizer.backend, chat_template=template)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(TokenizerError, match="failed to render: access to .* is unsafe"):
        hostile.render_chat(messages)
    assert messages == [{"role": "user", "content": "hi"}]


def test_template_helpers(tokenizer):
    helpers = Tokenizer(tokenizer.backend, bos_token_id=1, eos_token_id=2, chat_template=(
        "{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}"
        "{{ eos_token }}|{{ strftime_now('%Y') | length }}|{{ extra }}"))
    rendered = helpers.render_chat([{"role": "user", "content": "é"}], extra="x")
    assert rendered == '<|im_start|>{"role": "user", "content": "é"}<|im_end|>|4|x'


def test_folder_saved_by_transformers(tmp_path, tokenizer, hf_tokenizer):
    hf_tokenizer.save_pretrained(tmp_path)
    loaded = Tokenizer.from_folder(tmp_path)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.add_bos) == (1, 2, False)
    assert loaded.vocab_size == tokenizer.vocab_size
    assert loaded.stop_token_ids == tokenizer.stop_token_ids
    for text in PARITY_TEXTS:
        assert loaded.encode(text) == hf_tokenizer.encode(text)
        assert loaded.decode(loaded.encode(text)) == text
    for messages in CONVERSATIONS:
        assert loaded.render_chat(messages) == tokenizer.render_chat(messages)


def test_folder_written_from_the_gguf_tokenizer(tmp_path, tokenizer):
    (tmp_path / "tokenizer.json").write_text(tokenizer.backend.to_str(), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<|im_start|>", "special": True},
        "eos_token": "<|im_end|>",
        "add_bos_token": True,
        "chat_template": [{"name": "tool_use", "template": "tools"},
                          {"name": "default", "template": tokenizer.chat_template}],
    }), encoding="utf-8")
    loaded = Tokenizer.from_folder(tmp_path)
    text = "x   12 \n  3 中文 🐱<|im_end|>"
    assert loaded.encode(text) == [1, *tokenizer.encode(text)]
    assert loaded.encode(text, add_special_tokens=False) == tokenizer.encode(text)
    assert loaded.chat_template == tokenizer.chat_template
    assert loaded.stop_token_ids == (2, 0)


def test_folder_errors(tmp_path, tokenizer):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        Tokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text(tokenizer.backend.to_str(), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|nope|>"}')
    with pytest.raises(TokenizerError, match="eos_token '<|nope|>' is not in the vocabulary"):
        Tokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{broken")
    with pytest.raises(TokenizerError, match="tokenizer_config.json: cannot be read"):
        Tokenizer.from_folder(tmp_path)


def test_from_gguf_path_and_unsupported_models(smollm_path, tokenizer):
    from_path = Tokenizer.from_gguf(smollm_path)
    assert from_path.encode(PARITY_TEXTS[2]) == tokenizer.encode(PARITY_TEXTS[2])
    base = {"tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": []}
    with pytest.raises(TokenizerError, match="unsupported GGUF tokenizer model 'bert'"):
        Tokenizer.from_gguf(base | {"tokenizer.ggml.model": "bert"})
    with pytest.raises(TokenizerError, match="tokenizer.ggml.scores has 0 entries for 2"):
        Tokenizer.from_gguf(base | {"tokenizer.ggml.model": "llama"})
    with pytest.raises(TokenizerError, match="unsupported GGUF pre-tokenizer 'chatglm-bpe'"):
        Tokenizer.from_gguf(base | {"tokenizer.ggml.model": "gpt2",
                                    "tokenizer.ggml.pre": "chatglm-bpe"})
    with pytest.raises(TokenizerError, match="eos_token_id 7 is outside the vocabulary"):
        Tokenizer.from_gguf(base | {"tokenizer.ggml.model": "gpt2",
                                    "tokenizer.ggml.eos_token_id": 7})


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes stand for themselves,
    the others take the characters from U+0100 on, in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    shifted = iter(range(256, 512))
    return [chr(byte) if byte in printable else chr(next(shifted)) for byte in range(256)]


def synthetic_gguf(pre: str, merges: list[str], extra: list[tuple[str, int]] = ()) -> dict:
    tokens = byte_alphabet()
    tokens += ["".join(merge.split(" ")) for merge in merges]
    tokens += ["abc"]  # a whole word no merge sequence reaches
    types = [1] * len(tokens)
    for token, kind in [("<|end_of_text|>", 3), ("<|eot_id|>", 3), ("<think>", 4), *extra]:
        tokens.append(token)
        types.append(kind)
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.eos_token_id": tokens.index("<|end_of_text|>"),
            "tokenizer.ggml.eot_token_id": tokens.index("<|eot_id|>")}


@pytest.mark.parametrize("pre, pieces", [
    # GPT-2's contractions are lower case only; llama-3 and qwen2 ignore case.
    ("gpt2", ["I", "'m", "Ġ12345", "ĠDON", "'", "T", "Ġ", "Ġx"]),
    ("smollm", ["I", "'m", "Ġ", "1", "2", "3", "4", "5", "ĠDON", "'", "T", "Ġ", "Ġx"]),
    ("llama-bpe", ["I", "'m", "Ġ", "123", "45", "ĠDON", "'T", "Ġ", "Ġx"]),
    ("qwen2", ["I", "'m", "Ġ", "1", "2", "3", "4", "5", "ĠDON", "'T", "Ġ", "Ġx"]),
])
def test_gguf_pre_tokenizers_split_like_llama_cpp(pre, pieces):
    tokenizer = Tokenizer.from_gguf(synthetic_gguf(pre, []))
    split = tokenizer.backend.pre_tokenizer.pre_tokenize_str("I'm 12345 DON'T  x")
    assert [piece for piece, _ in split] == pieces


def test_gguf_merges_special_and_user_defined_tokens():
    merges = ["a b", "Ġ a"]
    plain = Tokenizer.from_gguf(synthetic_gguf("gpt2", merges))
    whole_words = Tokenizer.from_gguf(synthetic_gguf("llama-bpe", merges))
    piece = plain.backend.token_to_id
    assert plain.encode("abc a") == [piece("ab"), piece("c"), piece("Ġa")]
    # llama.cpp takes a word that is itself a token whole for llama-3 vocabularies.
    assert whole_words.encode("abc a") == [piece("abc"), piece("Ġa")]
    ids = plain.encode("x<think>y<|eot_id|>")
    assert ids == [piece("x"), piece("<think>"), piece("y"), piece("<|eot_id|>")]
    assert plain.decode(ids, skip_special_tokens=True) == "x<think>y"
    assert plain.stop_token_ids == (piece("<|end_of_text|>"), piece("<|eot_id|>"))
    assert plain.decode(plain.encode("Ünïcödé 🙂\n\t ok")) == "Ünïcödé 🙂\n\t ok"


def test_harmony_turns_end_at_return_and_call_not_at_end():
    """gpt-oss's vocabulary: <|end|> closes the analysis message inside a turn, so it must not
    stop generation; <|return|> and <|call|> do. A vocabulary without <|return|> (Phi-3's
    kind) still stops at <|end|> (the control)."""
    harmony_tokens = [("<|end|>", 3), ("<|return|>", 3), ("<|call|>", 3)]
    harmony = Tokenizer.from_gguf(synthetic_gguf("gpt2", [], harmony_tokens))
    piece = harmony.backend.token_to_id
    assert piece("<|end|>") not in harmony.stop_token_ids
    assert {piece("<|return|>"), piece("<|call|>")} <= set(harmony.stop_token_ids)
    plain = Tokenizer.from_gguf(synthetic_gguf("gpt2", [], [("<|end|>", 3)]))
    assert plain.backend.token_to_id("<|end|>") in plain.stop_token_ids
