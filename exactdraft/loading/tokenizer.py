"""Text to token ids and back, and chat rendering, for one checkpoint.

Invariant: a Tokenizer gives the ids the checkpoint's reference tokenizer gives (llama.cpp's rules
for a GGUF vocabulary, the `tokenizer.json` pipeline for a Hugging Face folder), adds a bos token
only where the checkpoint asks for one, and decodes ids back to the exact text they came from.
Chat templates come from checkpoint files and are untrusted: they render only inside jinja2's
immutable sandbox, with messages checked before they reach the template.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from exactdraft.errors import TokenizerError
from exactdraft.loading.chat_template import ChatTemplate
from exactdraft.loading.gemma4_vocabulary import gemma4_backend
from exactdraft.loading.sentencepiece import sentencepiece_backend

CHAT_ROLES = ("system", "user", "assistant", "tool")
# Tokens that close a turn or a document in the families we load (Gemma 4's turn ends at
# <turn|>); a special token of this name in the vocabulary stops generation together with eos.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
                      "<|endoftext|>", "<turn|>")
# The Harmony format (gpt-oss) ends a turn at <|return|> or at a tool call's <|call|>; its
# <|end|> closes one message of the turn (the analysis before the final answer), so in a
# vocabulary that has <|return|> it does not stop generation.
HARMONY_TURN_TOKENS = ("<|return|>", "<|call|>")

# llama.cpp token types (tokenizer.ggml.token_type).
_CONTROL = 3
_USER_DEFINED = 4

# Split patterns of the byte-level vocabularies, by tokenizer.ggml.pre. The GPT-2 pattern is the
# one built into the ByteLevel pre-tokenizer.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT2_PRE = ("default", "gpt2", "gpt-2", "mpt", "olmo", "jais")
# These split every digit off first, then apply the GPT-2 pattern to what is left.
_DIGITS_THEN_GPT2_PRE = ("smollm", "starcoder", "refact", "codeshell", "command-r", "exaone",
                         "minerva")
_LLAMA3_PRE = ("llama3", "llama-bpe", "llama-v3", "smaug-bpe", "dbrx", "falcon3")
_LLAMA3_PRE += ("lfm2",)  # LiquidAI's LFM2: llama.cpp splits and merges it as llama-3
_QWEN2_PRE = ("qwen2", "deepseek-r1-qwen")
SUPPORTED_GGUF_PRE_TOKENIZERS = _GPT2_PRE + _DIGITS_THEN_GPT2_PRE + _LLAMA3_PRE + _QWEN2_PRE


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the checkpoint's bos/eos rules and chat template."""

    def __init__(self, backend: Any, *, bos_token_id: int | None = None,
                 eos_token_id: int | None = None, add_bos: bool = False, add_eos: bool = False,
                 chat_template: str | None = None,
                 extra_stop_token_ids: Sequence[int] = ()) -> None:
        self.backend = backend
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        for name, value in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id),
                            *(("extra_stop_token_ids", v) for v in extra_stop_token_ids)):
            if value is not None and not 0 <= value < self.vocab_size:
                raise TokenizerError(
                    f"{name} {value} is outside the vocabulary [0, {self.vocab_size})")
        if add_bos and bos_token_id is None:
            raise TokenizerError("add_bos is set but the tokenizer has no bos token")
        if add_eos and eos_token_id is None:
            raise TokenizerError("add_eos is set but the tokenizer has no eos token")
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.chat_template = chat_template
        self._compiled_template: Any = None
        special = {index for index, token in backend.get_added_tokens_decoder().items()
                   if token.special}
        stops = [eos_token_id] if eos_token_id is not None else []
        stops += [i for i in extra_stop_token_ids if i is not None]
        harmony = backend.token_to_id(HARMONY_TURN_TOKENS[0]) in special
        names = [name for name in END_OF_TURN_TOKENS if not (harmony and name == "<|end|>")]
        for name in names + list(HARMONY_TURN_TOKENS if harmony else ()):
            index = backend.token_to_id(name)
            if index is not None and index in special:
                stops.append(index)
        self.stop_token_ids: tuple[int, ...] = tuple(dict.fromkeys(stops))

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, "
                f"eos={self.eos_token!r}, add_bos={self.add_bos})")

    @property
    def bos_token(self) -> str | None:
        return None if self.bos_token_id is None else self.backend.id_to_token(self.bos_token_id)

    @property
    def eos_token(self) -> str | None:
        return None if self.eos_token_id is None else self.backend.id_to_token(self.eos_token_id)

    # -- text <-> ids ----------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in the text (e.g. <|im_start|>) map to
        their ids. bos/eos are added only when the checkpoint asks for them."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode needs a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos:
                ids = [self.bos_token_id, *ids]
            if self.add_eos:
                ids = [*ids, self.eos_token_id]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        for position, index in enumerate(ids):
            if not 0 <= index < self.vocab_size:
                raise TokenizerError(f"token id {index} at index {position} is outside the "
                                     f"vocabulary [0, {self.vocab_size})")
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    # -- chat ------------------------------------------------------------------------------

    def render_chat(self, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool = True, **template_variables: Any) -> str:
        """The checkpoint's chat template applied to `messages` (each {"role", "content"});
        extra keyword arguments (e.g. tools, enable_thinking) are passed to the template."""
        if self.chat_template is None:
            raise TokenizerError("this checkpoint has no chat template; pass the prompt as plain "
                                 "text or token ids instead")
        checked = check_messages(messages)
        if self._compiled_template is None:
            self._compiled_template = ChatTemplate(self.chat_template)
        return self._compiled_template.render({
            "bos_token": self.bos_token or "", "eos_token": self.eos_token or "",
            **template_variables, "messages": checked,
            "add_generation_prompt": add_generation_prompt})

    def use_chat_template(self, source: str) -> None:
        """Render chats with `source` from now on instead of the checkpoint's template (see
        exactdraft.loading.builtin_templates.chat_template_source for checked sources)."""
        if not isinstance(source, str):
            raise TokenizerError(f"a chat template must be a string, got "
                                 f"{type(source).__name__}")
        self.chat_template, self._compiled_template = source, None

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def from_folder(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """From a Hugging Face folder: tokenizer.json, and tokenizer_config.json (bos/eos, add_bos,
        chat template; the template may also sit in chat_template.jinja or chat_template.json)."""
        from tokenizers import Tokenizer as Backend

        folder = os.fspath(path)
        tokenizer_file = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(tokenizer_file):
            raise TokenizerError(f"{folder}: no tokenizer.json")
        try:
            backend = Backend.from_file(tokenizer_file)
        except Exception as error:
            raise TokenizerError(f"{tokenizer_file}: cannot be read ({error})") from None
        config = _read_json(os.path.join(folder, "tokenizer_config.json")) or {}
        bos = _token_id(backend, config.get("bos_token"), "bos_token")
        eos = _token_id(backend, config.get("eos_token"), "eos_token")
        added_bos, added_eos = _post_processor_adds(backend, bos, eos)
        add_bos = bool(config["add_bos_token"]) if "add_bos_token" in config else added_bos
        add_eos = bool(config["add_eos_token"]) if "add_eos_token" in config else added_eos
        return cls(backend, bos_token_id=bos, eos_token_id=eos, add_bos=add_bos and bos is not None,
                   add_eos=add_eos and eos is not None,
                   chat_template=_folder_chat_template(folder, config))

    @classmethod
    def from_gguf(cls, source: str | os.PathLike[str] | Mapping[str, Any]) -> Tokenizer:
        """From GGUF metadata (a mapping of key -> value) or a GGUF file path."""
        if isinstance(source, Mapping):
            metadata = source
        else:
            from exactdraft.loading.gguf import read_gguf_metadata

            metadata = read_gguf_metadata(source)
        model = metadata.get("tokenizer.ggml.model")
        if model not in ("gpt2", "llama", "gemma4"):
            raise TokenizerError(f"unsupported GGUF tokenizer model {model!r}; supported: gpt2 "
                                 "(byte-level BPE), llama (SentencePiece-style), gemma4 (BPE on "
                                 "UTF-8 with byte fallback)")
        tokens = list(metadata.get("tokenizer.ggml.tokens") or ())
        if not tokens or not all(isinstance(t, str) for t in tokens):
            raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens list of strings")
        token_types = list(metadata.get("tokenizer.ggml.token_type") or ())
        if token_types and len(token_types) != len(tokens):
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(token_types)} entries for "
                                 f"{len(tokens)} tokens")
        if model == "llama":
            scores = list(metadata.get("tokenizer.ggml.scores") or ())
            if len(scores) != len(tokens):
                raise TokenizerError(f"tokenizer.ggml.scores has {len(scores)} entries for "
                                     f"{len(tokens)} tokens")
            backend = sentencepiece_backend(
                tokens, scores, token_types or [1] * len(tokens),
                add_space_prefix=bool(metadata.get("tokenizer.ggml.add_space_prefix", True)),
                unknown_token_id=metadata.get("tokenizer.ggml.unknown_token_id"))
        elif model == "gemma4":
            merges = metadata.get("tokenizer.ggml.merges")
            if not isinstance(merges, Sequence) or isinstance(merges, str) or not merges:
                raise TokenizerError("GGUF metadata of a gemma4 tokenizer has no "
                                     "tokenizer.ggml.merges list")
            backend = gemma4_backend(tokens, token_types or [1] * len(tokens), list(merges))
        else:
            backend = _byte_level_backend(tokens,
                                          list(metadata.get("tokenizer.ggml.merges") or ()),
                                          token_types,
                                          metadata.get("tokenizer.ggml.pre", "default"))
        extra_stops = [metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("eot", "eom")]
        return cls(backend,
                   bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
                   eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
                   # llama.cpp adds bos for a gemma4 vocabulary whatever the file says.
                   add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", False))
                   or model == "gemma4",
                   add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
                   chat_template=metadata.get("tokenizer.chat_template"),
                   extra_stop_token_ids=[int(i) for i in extra_stops if i is not None])


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Copies of the messages after checking each is {"role": known role, "content": str}."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TokenizerError(f"messages must be a list of dicts, got {type(messages).__name__}")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TokenizerError(
                f"message {index} must be a dict with role and content, got {message!r}")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise TokenizerError(
                f"message {index} has unknown role {role!r}; known: {', '.join(CHAT_ROLES)}")
        if not isinstance(message.get("content"), str):
            raise TokenizerError(f"message {index} ({role}) needs string content, got "
                                 f"{message.get('content')!r}")
        checked.append(dict(message))
    return checked


def _byte_level_backend(tokens: list[str], merges: list[str], token_types: list[int],
                        pre: str) -> Any:
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    if pre not in SUPPORTED_GGUF_PRE_TOKENIZERS:
        raise TokenizerError(f"unsupported GGUF pre-tokenizer {pre!r}; supported: "
                             + ", ".join(SUPPORTED_GGUF_PRE_TOKENIZERS))
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    pairs = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise TokenizerError(f"GGUF merge {merge!r} is not two tokens separated by a space")
        pairs.append((parts[0], parts[1]))
    # llama.cpp takes a whole word straight from the vocabulary for llama-3 style vocabularies.
    backend = Backend(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre in _LLAMA3_PRE))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2_PRE:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in _LLAMA3_PRE or pre in _QWEN2_PRE:
        split = _LLAMA3_SPLIT if pre in _LLAMA3_PRE else _QWEN2_SPLIT
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    # Control and user-defined tokens are matched whole in the text before BPE runs, as
    # llama.cpp does; both are already in the vocabulary, so they keep their ids.
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, kind in enumerate(token_types) if kind == _CONTROL]
    plain = [AddedToken(tokens[i], special=False, normalized=False)
             for i, kind in enumerate(token_types) if kind == _USER_DEFINED]
    backend.add_special_tokens(special)
    backend.add_tokens(plain)
    return backend


def _read_json(path: str) -> Any:
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TokenizerError(f"{path}: cannot be read as JSON ({error})") from None


def _token_id(backend: Any, token: Any, key: str) -> int | None:
    """The id of a tokenizer_config.json special token given as a string or {"content": ...}."""
    if isinstance(token, Mapping):
        token = token.get("content")
    if token is None:
        return None
    if not isinstance(token, str):
        raise TokenizerError(f"tokenizer_config.json {key} must be a string, got {token!r}")
    index = backend.token_to_id(token)
    if index is None:
        raise TokenizerError(f"tokenizer_config.json {key} {token!r} is not in the vocabulary")
    return index


def _post_processor_adds(backend: Any, bos: int | None, eos: int | None) -> tuple[bool, bool]:
    """Whether tokenizer.json's post-processor puts bos in front and eos at the end."""
    plain = backend.encode("a", add_special_tokens=False).ids
    full = backend.encode("a", add_special_tokens=True).ids
    if len(full) <= len(plain):
        return False, False
    return (bos is not None and full[0] == bos and full[1:len(plain) + 1] == plain,
            eos is not None and full[-1] == eos and full[-len(plain) - 1:-1] == plain)


def _folder_chat_template(folder: str, config: Mapping[str, Any]) -> str | None:
    template = config.get("chat_template")
    if template is None:
        jinja_file = os.path.join(folder, "chat_template.jinja")
        if os.path.isfile(jinja_file):
            with open(jinja_file, encoding="utf-8") as handle:
                return handle.read()
        template = (_read_json(os.path.join(folder, "chat_template.json")) or {}).get(
            "chat_template")
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template
                 if isinstance(entry, Mapping)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise TokenizerError(f"{folder}: chat_template must be a string, got {template!r}")
    return template
