"""SentencePiece-style GGUF vocabularies (tokenizer.ggml.model "llama") as `tokenizers` pipelines.

Invariant: for any text, the backend built here gives the ids llama.cpp's SPM tokenizer gives
for that vocabulary with `special=True` (control and user-defined tokens written in the text
map to their own ids), and with `backend.encode_special_tokens = True` the ids it gives with
`special=False` (user-defined tokens are still matched, control tokens are not). Decoding gives
back the text llama.cpp's detokenizer gives with special tokens rendered.

How llama.cpp tokenizes such a vocabulary, and how each step is mirrored here:

* Control (token type 3), unknown (2) and user-defined (4) tokens are cut out of the raw text
  first. They become `AddedToken`s that are not normalized; control and unknown ones are
  special, so `encode_special_tokens` turns them off as `special=False` does. llama.cpp also
  makes a token control by its text when the text names an end of generation ("</s>",
  "<|im_end|>", "<end_of_turn>", ...), whatever its type says; so does this module.
* Each remaining piece gets a space in front when the vocabulary asks for it (also after
  every cut-out token, as llama.cpp does), and its spaces become U+2581 "▁".
* The piece is split into characters, and the adjacent pair whose concatenation is a token
  with the highest score is merged, the leftmost on a tie, until no pair is a token. This is
  BPE with one merge for every way of writing each token as two tokens, ranked by the score
  of the merged token (higher first).
* A character that is not a token falls back to its UTF-8 bytes as `<0xXX>` tokens.

Known differences (no Gemma 3 fixture string hits any of them):

* The BPE model ranks every merge apart, so when two merges of equal score are ready at once
  and the choice changes what follows, the one listed first goes first where llama.cpp takes
  the leftmost. Equal scores come from different splits of one token, or from tokens that
  share a score (Gemma 3: the byte tokens and "▁t" at 0, control tokens at -1000), whose
  merges do not touch one another.
* The decoder turns "▁" into a space in every piece, where llama.cpp copies the text of
  control and user-defined tokens as it is; it matters only for such a token containing "▁".
* llama.cpp's strip attributes, set by model name (Phi-3, Jina), and its guess at
  fill-in-the-middle tokens by their text when the metadata names none, are not mirrored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exactdraft.errors import TokenizerError

SPACE = "\u2581"

# llama.cpp token types (tokenizer.ggml.token_type).
_UNKNOWN = 2
_CONTROL = 3
_USER_DEFINED = 4

# Token texts llama.cpp marks as control because they end generation (llama-vocab.cpp).
END_OF_GENERATION_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["))


def sentencepiece_backend(tokens: Sequence[str], scores: Sequence[float],
                          token_types: Sequence[int], *, add_space_prefix: bool,
                          unknown_token_id: int | None) -> Any:
    """A `tokenizers.Tokenizer` that splits text into this vocabulary's ids as llama.cpp does.

    tokens, scores and token_types are tokenizer.ggml.tokens, .scores and .token_type;
    add_space_prefix is tokenizer.ggml.add_space_prefix (llama.cpp's default is True) and
    unknown_token_id tokenizer.ggml.unknown_token_id. No bos or eos is added."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, normalizers

    tokens = list(tokens)
    if not tokens:
        raise TokenizerError("the vocabulary has no tokens")
    for name, values in (("scores", scores), ("token types", token_types)):
        if len(values) != len(tokens):
            raise TokenizerError(f"{len(values)} {name} for {len(tokens)} tokens")
    if unknown_token_id is not None and not 0 <= unknown_token_id < len(tokens):
        raise TokenizerError(f"unknown_token_id {unknown_token_id} is outside the vocabulary "
                             f"[0, {len(tokens)})")
    vocab = vocabulary_ids(tokens)
    model = models.BPE(vocab=vocab, merges=score_ranked_merges(tokens, scores, vocab),
                       unk_token=None if unknown_token_id is None else tokens[unknown_token_id],
                       byte_fallback=True)
    backend = Backend(model)
    replace = normalizers.Replace(" ", SPACE)
    backend.normalizer = (normalizers.Sequence([normalizers.Prepend(SPACE), replace])
                          if add_space_prefix else replace)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    add_cut_out_tokens(backend, tokens, token_types)
    return backend


def vocabulary_ids(tokens: Sequence[str]) -> dict[str, int]:
    """token -> id of tokenizer.ggml.tokens; a token listed twice is refused with both ids."""
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        first = vocab.setdefault(token, index)
        if first != index:
            raise TokenizerError(f"tokenizer.ggml.tokens: token {token!r} appears twice (ids "
                                 f"{first} and {index})")
    return vocab


def score_ranked_merges(tokens: Sequence[str], scores: Sequence[float],
                        vocab: dict[str, int] | None = None) -> list[tuple[str, str]]:
    """Every (left, right) pair of tokens whose concatenation is a token, the pairs that make a
    higher-scoring token first; equal scores in token id order, and the splits of one token
    from the shortest left part on."""
    if vocab is None:
        vocab = {token: index for index, token in enumerate(tokens)}
    order = sorted(vocab.values(), key=lambda index: (-float(scores[index]), index))
    merges: list[tuple[str, str]] = []
    add = merges.append
    for index in order:
        token = tokens[index]
        for cut in range(1, len(token)):
            left = token[:cut]
            if left in vocab:
                right = token[cut:]
                if right in vocab:
                    add((left, right))
    return merges


def add_cut_out_tokens(backend: Any, tokens: Sequence[str], token_types: Sequence[int]) -> None:
    """Adds the tokens llama.cpp cuts out of the raw text before splitting it: control and
    unknown tokens and those whose text ends generation as special tokens, user-defined ones as
    plain tokens; none is normalized, and each keeps its id."""
    from tokenizers import AddedToken

    special, plain = [], []
    for token, kind in zip(tokens, token_types):
        if kind in (_CONTROL, _UNKNOWN) or token in END_OF_GENERATION_TEXTS:
            special.append(AddedToken(token, special=True, normalized=False))
        elif kind == _USER_DEFINED:
            plain.append(AddedToken(token, special=False, normalized=False))
    backend.add_special_tokens(special)
    backend.add_tokens(plain)
