"""exactdraft's side of llguidance: tokenizers as byte tables, and compiled grammars, cached.

Invariant: `token_bytes(tokenizer)[i]` is the byte string token i adds to the decoded text, so
the bytes a grammar sees for a token sequence are the bytes exactdraft's own decode gives for it
(byte-level BPE vocabularies such as SmolLM2's through the GPT-2 byte alphabet, SentencePiece
vocabularies such as Gemma 3's through "\u2581" -> space and <0xXX> byte tokens). Special tokens
(control tokens: bos, eos, end of turn) are marked special, so a grammar never produces them as
text. One llguidance tokenizer is built per tokenizer object, and each constraint is compiled
once per tokenizer object; generations copy the compiled matcher in its initial state.

The llguidance tokenizer also needs a text -> ids function (it tokenizes the bytes a grammar
forces, to propose them as tokens); it uses the checkpoint's own encoder, and a greedy
longest-match over the byte table where that encoder would change the text (a SentencePiece
vocabulary that puts a space in front of every text). Forced bytes are text, so they are never
tokenized into a special token: where the encoder reads a special token's text (`<|im_end|>` in
a JSON const) as that token, the text is encoded again with special tokens read as text.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from exactdraft.errors import ConstraintError, TokenizerError

_SPACE = "\u2581"
# Texts whose tokens a bridge remembers (llguidance asks for the same forced bytes often).
TOKENIZED_TEXTS = 4096


def _byte_level_alphabet() -> dict[str, int]:
    """The GPT-2 byte-level alphabet, character -> byte: printable bytes stand for themselves,
    the other 68 bytes for the code points from 256 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    alphabet = {chr(b): b for b in printable}
    shifted = 0
    for byte in range(256):
        if byte not in alphabet.values():
            alphabet[chr(256 + shifted)] = byte
            shifted += 1
    return alphabet


def _backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` behind an exactdraft Tokenizer (or that object itself)."""
    backend = getattr(tokenizer, "backend", tokenizer)
    if not all(hasattr(backend, name) for name in ("id_to_token", "get_vocab_size",
                                                   "get_added_tokens_decoder", "encode")):
        raise ConstraintError(f"constraints need an exactdraft Tokenizer (or a tokenizers."
                              f"Tokenizer), got {type(tokenizer).__name__}")
    return backend


def _decoder_steps(backend: Any) -> list[dict[str, Any]]:
    """The decoder's steps as tokenizers serialises them, a Sequence flattened."""
    if backend.decoder is None:
        return []
    state = json.loads(backend.decoder.__getstate__())
    steps = state.get("decoders") if state.get("type") == "Sequence" else [state]
    return list(steps or [])


def token_bytes(tokenizer: Any) -> tuple[list[bytes], list[int]]:
    """(the byte string of every token id, the ids of special tokens) for an exactdraft
    Tokenizer. Raises ConstraintError for a decoder this bridge cannot read exactly."""
    backend = _backend(tokenizer)
    steps = _decoder_steps(backend)
    kinds = {step.get("type") for step in steps}
    unknown = kinds - {"ByteLevel", "Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"}
    if unknown:
        raise ConstraintError(f"constraints cannot read token bytes through the tokenizer "
                              f"decoder step(s) {sorted(unknown)}")
    replacements: list[tuple[str, str]] = []
    for step in steps:
        if step.get("type") == "Replace":
            pattern = step.get("pattern", {})
            if "String" not in pattern:
                raise ConstraintError(f"constraints cannot read a regex Replace decoder "
                                      f"({pattern})")
            replacements.append((pattern["String"], step.get("content", "")))
        elif step.get("type") == "Metaspace":
            replacements.append((step.get("replacement", _SPACE), " "))
    byte_level = _byte_level_alphabet() if "ByteLevel" in kinds else None
    byte_fallback = "ByteFallback" in kinds
    added = backend.get_added_tokens_decoder()
    count = backend.get_vocab_size(with_added_tokens=True)
    table: list[bytes] = []
    for index in range(count):
        piece = backend.id_to_token(index)
        if piece is None:  # a hole in the id range: no text, never allowed
            table.append(b"")
            continue
        if index in added:
            table.append(added[index].content.encode("utf-8"))
            continue
        if byte_level is not None and all(c in byte_level for c in piece):
            table.append(bytes(byte_level[c] for c in piece))
            continue
        if byte_fallback and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            try:
                table.append(bytes([int(piece[3:5], 16)]))
                continue
            except ValueError:
                pass
        for old, new in replacements:
            piece = piece.replace(old, new)
        table.append(piece.encode("utf-8"))
    special = sorted(i for i, token in added.items() if token.special and i < count)
    return table, special


class _TokenTable:
    """What llguidance's TokenizerWrapper protocol reads: tokens, eos/bos ids, special ids, and
    a call that tokenizes text (str or UTF-8 bytes)."""

    is_tokenizer_wrapper = True

    def __init__(self, backend: Any, tokens: list[bytes], special: list[int],
                 eos_token_id: int, bos_token_id: int | None) -> None:
        self.tokens = tokens
        self.special_token_ids = special
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self._backend = backend
        specials = set(special)
        self._specials = specials
        self._text_encoder: Any = None  # _text_encoding's copy of the encoder
        self._cannot_copy = False  # the encoder could not be copied: not tried again
        self._copy_lock = threading.Lock()  # one copy, made once, under concurrent compiles
        self._by_bytes = {piece: i for i, piece in enumerate(tokens)
                          if piece and i not in specials}
        self._longest = max((len(piece) for piece in self._by_bytes), default=1)
        # llguidance tokenizes the bytes a grammar forces while it computes masks, often the
        # same text at several positions in a row and again in every generation under the same
        # grammar: the answer is a function of the text, so it is kept (a bounded memo).
        self._memo: dict[str, tuple[int, ...]] = {}

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        ids = self._memo.get(text)
        if ids is None:
            ids = tuple(self._encode(text))
            if len(self._memo) >= TOKENIZED_TEXTS:
                self._memo.clear()
            self._memo[text] = ids
        return list(ids)

    def _encode(self, text: str) -> list[int]:
        data = text.encode("utf-8")
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if not self._specials.isdisjoint(ids):  # a special token's text read as that token
            ids = self._text_encoding(text)
        if b"".join(self.tokens[i] for i in ids) == data and self._specials.isdisjoint(ids):
            return list(ids)
        return self._greedy(data)

    def _text_encoding(self, text: str) -> list[int]:
        """The encoder's ids for `text` with special tokens' texts read as text (a copy of the
        encoder that does so, made once, the first time a forced text holds one); [] where the
        encoder cannot be copied (the greedy split answers then, and no copy is tried again)."""
        if self._text_encoder is None and not self._cannot_copy:
            with self._copy_lock:
                if self._text_encoder is None and not self._cannot_copy:
                    self._text_encoder = self._copied_encoder()
                    self._cannot_copy = self._text_encoder is None
        if self._text_encoder is None:
            return []
        return list(self._text_encoder.encode(text, add_special_tokens=False).ids)

    def _copied_encoder(self) -> Any:
        """A copy of the encoder that reads special tokens' texts as text; None where it cannot
        be copied."""
        try:
            from tokenizers import Tokenizer as Backend

            encoder = Backend.from_str(self._backend.to_str())
            encoder.encode_special_tokens = True
        except Exception:  # tokenizers raises plain Exceptions; a stand-in has no to_str
            return None
        return encoder

    def _greedy(self, data: bytes) -> list[int]:
        """Longest match first over the byte table (a fallback: the encoder changed the text)."""
        ids, at = [], 0
        while at < len(data):
            for size in range(min(self._longest, len(data) - at), 0, -1):
                index = self._by_bytes.get(data[at:at + size])
                if index is not None:
                    ids.append(index)
                    at += size
                    break
            else:  # no token spells this byte: llguidance falls back to its own greedy split
                return ids
        return ids


class TokenizerBridge:
    """An exactdraft tokenizer as llguidance sees it: the llguidance tokenizer, the byte table,
    the special ids and the eos id llguidance was given."""

    def __init__(self, tokenizer: Any) -> None:
        llguidance = llguidance_module()
        backend = _backend(tokenizer)
        self.tokens, self.special_token_ids = token_bytes(tokenizer)
        self.size = len(self.tokens)
        eos = getattr(tokenizer, "eos_token_id", None)
        stops = tuple(getattr(tokenizer, "stop_token_ids", ()) or ())
        if eos is None:
            eos = stops[0] if stops else None
        if eos is None or not 0 <= eos < self.size:
            raise TokenizerError("constraints need a tokenizer with an eos token inside its "
                                 f"vocabulary, got eos {eos!r}")
        self.eos_token_id = int(eos)
        table = _TokenTable(backend, self.tokens, self.special_token_ids, self.eos_token_id,
                            getattr(tokenizer, "bos_token_id", None))
        try:
            self.ll_tokenizer = llguidance.LLTokenizer(table)
        except (ValueError, TypeError) as error:
            raise ConstraintError(f"llguidance cannot use this tokenizer: {error}") from None


_bridges: weakref.WeakKeyDictionary[Any, TokenizerBridge] = weakref.WeakKeyDictionary()
_bridges_lock = threading.Lock()


def bridge_for(tokenizer: Any) -> TokenizerBridge:
    """The bridge of this tokenizer object, built once (about 0.1 s for a 49k vocabulary)."""
    with _bridges_lock:
        bridge = _bridges.get(tokenizer)
    if bridge is None:
        bridge = TokenizerBridge(tokenizer)
        with _bridges_lock:
            bridge = _bridges.setdefault(tokenizer, bridge)
    return bridge


def decode_bytes(tokens: Sequence[bytes], ids: Sequence[int]) -> bytes:
    """The bytes of `ids` under a byte table."""
    return b"".join(tokens[i] for i in ids)


# -- compiled grammars -------------------------------------------------------------------------

def llguidance_module() -> Any:
    """The llguidance package, or a ConstraintError saying how to install it."""
    try:
        import llguidance
    except ImportError:
        raise ConstraintError("constraints need llguidance: pip install llguidance (or, in "
                              "an exactdraft checkout, pip install -e \".[constraints]\")"
                              ) from None
    return llguidance


_byte_tokenizer: Any = None


def byte_tokenizer() -> Any:
    """llguidance's 256-byte vocabulary (plus eos), for checks that need no real tokenizer."""
    global _byte_tokenizer
    if _byte_tokenizer is None:
        _byte_tokenizer = llguidance_module().LLTokenizer("byte")
    return _byte_tokenizer


# Compiled matchers kept per tokenizer (in their initial state, copied for each generation).
COMPILED_PER_TOKENIZER = 64
_compiled_cache: weakref.WeakKeyDictionary[Any, OrderedDict] = weakref.WeakKeyDictionary()
_compiled_lock = threading.Lock()


def compiled_matcher(constraint: Any, tokenizer: Any, bridge: Any) -> Any:
    """The llguidance matcher of `constraint` (a Constraint) over this tokenizer, in its
    initial state: compiled once per (tokenizer object, constraint), copied per generation."""
    with _compiled_lock:
        per_tokenizer = _compiled_cache.setdefault(tokenizer, OrderedDict())
        matcher = per_tokenizer.get(constraint)
        if matcher is not None:
            per_tokenizer.move_to_end(constraint)
            return matcher
    matcher = llguidance_module().LLMatcher(bridge.ll_tokenizer, constraint.llguidance_grammar,
                                      log_level=0)
    if matcher.is_error():
        raise ConstraintError(f"invalid {constraint.kind} {short(constraint.source)}: "
                              f"{matcher.get_error().strip()}")
    refuse_empty(matcher, constraint.kind, constraint.source, bridge.size,
                  bridge.eos_token_id, "with this tokenizer's tokens")
    refuse_failing(matcher, constraint.kind, constraint.source, bridge.size,
                   bridge.eos_token_id)
    with _compiled_lock:
        per_tokenizer[constraint] = matcher
        while len(per_tokenizer) > COMPILED_PER_TOKENIZER:
            per_tokenizer.popitem(last=False)
    return matcher


def refuse_empty(matcher: Any, kind: str, source: str, size: int, eos: int,
                  where: str = "") -> None:
    """ConstraintError if the matcher's initial state allows no text at all."""
    if matcher.is_error():
        raise ConstraintError(f"invalid {kind} {short(source)}: {matcher.get_error().strip()}")
    if matcher.is_accepting():
        return
    bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8),
                         bitorder="little")[:size].astype(bool)
    bits[eos] = False
    if not bits.any() or matcher.is_error():
        suffix = f" {where}" if where else ""
        raise ConstraintError(f"{kind} {short(source)} matches nothing{suffix}")


# Tokens the probe walks (forced runs count as one step); llguidance's limits (a parser row of
# more than 2000 items, the lexer's expression budget) are met on the first tokens or so.
PROBE_STEPS = 16
DEAD_END = "NoExtensionBias"  # llguidance's error where nothing may follow


def refuse_failing(matcher: Any, kind: str, source: str, size: int, eos: int) -> None:
    """ConstraintError if llguidance fails on the first tokens of a text the constraint allows:
    a copy of the matcher takes the forced tokens, else the lowest allowed id other than eos,
    for up to PROBE_STEPS steps, computing each mask. Limits llguidance meets only while it
    runs (a parser row over max_items_in_row, the lexer's expression budget) thus show before
    any model pass, where a generation would otherwise fail at its first tokens."""
    probe = matcher.deep_copy()
    for _ in range(PROBE_STEPS):
        if probe.is_error() or probe.is_stopped():
            break
        forced = probe.compute_ff_tokens()
        if forced:
            probe.consume_tokens(forced)
            continue
        bits = np.unpackbits(np.frombuffer(probe.compute_bitmask(), dtype=np.uint8),
                             bitorder="little")[:size].astype(bool)
        bits[eos] = False
        allowed = np.flatnonzero(bits)
        if probe.is_error() or not len(allowed):
            break
        probe.consume_token(int(allowed[0]))
    reason = probe.get_error().split("\n<state>", 1)[0].strip() if probe.is_error() else ""
    # A dead end (a grammar with no way to finish) is no failure: a generation that reaches it
    # ends "unsatisfiable", as it would at any depth.
    if reason and reason != DEAD_END:
        raise ConstraintError(f"{kind} {short(source)} is beyond what llguidance can follow: "
                              f"{reason}")


def short(text: str, limit: int = 120) -> str:
    """A constraint's text for an error message: repr, cut at `limit` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")
