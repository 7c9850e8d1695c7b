"""Gemma 4 GGUF vocabularies (tokenizer.ggml.model "gemma4") as `tokenizers` pipelines.

Invariant: for any text, the backend built here gives the ids llama.cpp's `gemma4` tokenizer
gives for that vocabulary with `special=True`, which for a vocabulary converted from a Hugging
Face Gemma 4 `tokenizer.json` are that tokenizer's ids; decoding gives that tokenizer's text.

llama.cpp's converter writes Gemma 4's tokenizer as model `gemma4`: the tokens of
`tokenizer.json` (spaces written as U+2581 "▁", bytes as `<0xXX>` tokens), a score of -1000
each (unused), token types (control for the Hugging Face special tokens, user-defined for the
added tokens past the base vocabulary that are not special and for the tokens a chat parser
must see, such as `<|channel>`), the BPE merges in rank order, `add_space_prefix` false and
`add_bos_token` true.
llama.cpp reads that as BPE on raw UTF-8, and each step is mirrored here:

* Control, unknown and user-defined tokens are cut out of the raw text first (control tokens
  and tokens whose text ends generation are special, so `encode_special_tokens` turns them
  off as `special=False` does).
* Every space of the remaining text becomes "▁"; the text is split into runs of newlines and
  runs of everything else, and each run is merged pair by pair, the pair of lowest merge rank
  first (the leftmost on a tie), starting from single characters.
* A character that no merge reaches and that is not a token falls back to its UTF-8 bytes as
  `<0xXX>` tokens.
* A bos token is always added in front (`Tokenizer.from_gguf`): llama.cpp forces `add_bos`
  for this tokenizer.

Known differences (no fixture string hits them):

* llama.cpp takes a run of newlines whole when the run is a token and merges it otherwise;
  here the merges build it. A run that is a user-defined token is cut out whole before either
  step.
* llama.cpp's detokenizer removes a space before "?", "!", "." and "," and around
  apostrophes (`clean_spaces`); the decoder here gives the Hugging Face tokenizer's text,
  which keeps them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from exactdraft.errors import TokenizerError
from exactdraft.loading.sentencepiece import SPACE, add_cut_out_tokens, vocabulary_ids

# llama.cpp's pre-tokenizer for `gemma4`: runs of newlines and runs of everything else.
_NEWLINE_RUNS = r"[^\n]+|[\n]+"


def gemma4_backend(tokens: Sequence[str], token_types: Sequence[int],
                   merges: Sequence[str]) -> Any:
    """A `tokenizers.Tokenizer` that splits text into this vocabulary's ids as llama.cpp does.

    tokens, token_types and merges are tokenizer.ggml.tokens, .token_type and .merges. No bos
    or eos is added."""
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as Backend

    tokens = list(tokens)
    if len(token_types) != len(tokens):
        raise TokenizerError(f"tokenizer.ggml.token_type has {len(token_types)} entries for "
                             f"{len(tokens)} tokens")
    vocab = vocabulary_ids(tokens)
    pairs = [_merge_pair(index, merge, vocab) for index, merge in enumerate(merges)]
    backend = Backend(models.BPE(vocab=vocab, merges=pairs, byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", SPACE)
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(_NEWLINE_RUNS), behavior="isolated")
    backend.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
    add_cut_out_tokens(backend, tokens, token_types)
    return backend


def _merge_pair(index: int, merge: Any, vocab: dict[str, int]) -> tuple[str, str]:
    """The two tokens of one merge, split at the first space after the first character, as
    llama.cpp splits it; both, and what they merge into, must be tokens."""
    cut = merge.find(" ", 1) if isinstance(merge, str) else -1
    if cut < 0:
        raise TokenizerError(f"tokenizer.ggml.merges entry {index} {merge!r} is not two tokens "
                             "separated by a space")
    left, right = merge[:cut], merge[cut + 1:]
    for part in (left, right, left + right):
        if part not in vocab:
            raise TokenizerError(f"tokenizer.ggml.merges entry {index} {merge!r}: {part!r} is "
                                 "not in tokenizer.ggml.tokens")
    return left, right
