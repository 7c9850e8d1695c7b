"""The state of one constrained generation, and the mask it puts on a row of logits.

Invariant: a ConstraintMatcher's state is a pure function of (the constraint, the tokenizer, the
tokens consumed): `allowed()` after consuming t1..tn, however the matcher got there (directly,
after a rollback, on a copy), is the same array, bit for bit. So a verify row at position p
masks its logits with the same set a serial step at p would use, and the mask, applied as
SAMPLER.md's first processor (`apply_mask`: -inf at every forbidden id), keeps drafted output
equal to serial output. Stop tokens are allowed exactly when the consumed text is a complete
match; ids past the tokenizer's vocabulary (a model's padding rows) are never allowed.

`forced()` gives the tokenizer's own tokens for the bytes the grammar forces next. They are
allowed in sequence, but where the vocabulary can spell those bytes another way the mask still
allows the other spellings, so they are drafts to verify, never tokens to commit unchecked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from exactdraft.errors import ConstraintError

# At most this many forced tokens are proposed at once.
MAX_FORCED = 64
# A mask that allows (or forbids) at most this many ids also keeps them as an index array:
# applying it then writes that many values into a row of -inf (or that many -inf into a copy
# of the row), a few microseconds instead of a select over the whole vocabulary. The same row
# either way.
SPARSE_IDS = 1024


class ConstraintMatcher:
    """The state of one constrained generation: which tokens may come next.

    Every query is answered from the tokens consumed so far and changes nothing; only
    `consume` and `rollback` move the state. Masks are cached per prefix length, so rows that
    a rollback returns to are not recomputed."""

    def __init__(self, constraint: Any, bridge: Any, ll_matcher: Any, vocab_size: int,
                 stop_token_ids: tuple[int, ...]) -> None:
        self.constraint = constraint
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self._bridge = bridge
        self._ll = ll_matcher
        self._stops = np.asarray(stop_token_ids, dtype=np.int64)
        self._stop_set = frozenset(stop_token_ids)
        # Ids never handed to llguidance: past the model's or the tokenizer's vocabulary, and
        # llguidance's eos when the caller does not count it as a stop.
        self._usable = min(vocab_size, bridge.size)
        self._ll_eos = bridge.eos_token_id
        # By number of tokens given to llguidance: (mask, allowed ids where few, forbidden ids
        # where few), the ids None where there are more than SPARSE_IDS.
        self._masks: list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None] | None] = \
            [None]
        # llguidance writes each mask into this one buffer (32 ids a word), read at once.
        self._words = np.zeros((bridge.ll_tokenizer.vocab_size + 31) // 32, dtype=np.int32)
        self._words_at = self._words.ctypes.data  # the buffer never moves: its address, once
        self._tokens: list[int] = []
        self._stopped = False  # a stop token was consumed: the generation is over

    # -- queries ---------------------------------------------------------------------------

    def allowed(self) -> np.ndarray:
        """bool [vocab_size], read-only: the tokens that may come next."""
        return self._mask_entry()[0]

    def allowed_ids(self) -> np.ndarray | None:
        """The ids allowed() allows, ascending and read-only, where there are at most
        SPARSE_IDS of them; None where there are more."""
        return self._mask_entry()[1]

    def forbidden_ids(self) -> np.ndarray | None:
        """The ids allowed() forbids, ascending and read-only, where there are at most
        SPARSE_IDS of them; None where there are more."""
        return self._mask_entry()[2]

    @property
    def any_allowed(self) -> bool:
        """Some token may come next (allowed().any(), from the cached ids where few)."""
        ids = self._mask_entry()[1]
        return ids is None or ids.size > 0

    @property
    def complete(self) -> bool:
        """The consumed text is a complete match (a stop token may end it, or did)."""
        return self._stopped or (not self._ll.is_error() and self._ll.is_accepting())

    @property
    def stopped(self) -> bool:
        """A stop token was consumed: nothing more is allowed, and that is not an error."""
        return self._stopped

    @property
    def dead(self) -> bool:
        """Nothing is allowed and the text is not a complete match: no way to finish it."""
        return not self.complete and not self.any_allowed

    def only_allowed(self) -> int | None:
        """The token, where exactly one is allowed: it is the draw at any temperature (a stop
        token included), so it can be drafted and is always kept."""
        ids = self.allowed_ids()
        return int(ids[0]) if ids is not None and ids.size == 1 else None

    @property
    def tokens(self) -> tuple[int, ...]:
        """The tokens consumed so far."""
        return tuple(self._tokens)

    @property
    def consumed(self) -> list[int]:
        """The tokens consumed so far, as the matcher's own list: read it, never change it
        (`tokens` is the copy)."""
        return self._tokens

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` are allowed one after another from here."""
        tokens = [int(t) for t in tokens]
        if self._stopped or not tokens:
            return 0
        head = []
        for token in tokens:
            if self._plain(token):
                head.append(token)
            else:
                break
        count = self._ll.validate_tokens(head) if head else 0
        if count < len(head) or count == len(tokens) or tokens[count] not in self._stop_set:
            return count
        # The next token is a stop: allowed iff the text up to it is a complete match.
        if count == 0:
            return 1 if self.complete else 0
        if not self._ll.consume_tokens(head):
            raise ConstraintError(f"llguidance refused tokens it had validated: "
                                  f"{self._ll.get_error()}")
        accepting = self._ll.is_accepting()
        if not self._ll.rollback(count):
            raise ConstraintError(f"llguidance could not roll back {count} tokens: "
                                  f"{self._ll.get_error()}")
        return count + 1 if accepting else count

    def forced(self, limit: int = MAX_FORCED) -> list[int]:
        """The tokenizer's tokens for the bytes the grammar forces next (up to `limit`), each
        allowed in sequence; empty where nothing is forced. Drafts, not certainties: see the
        module docstring."""
        if self._stopped or self._ll.is_error() or limit <= 0:
            return []
        tokens = self._ll.compute_ff_tokens()
        # llguidance holds back the last token of the forced bytes where a longer token could
        # also start there (' "' before a string's first character): that token, the way the
        # tokenizer spells all of them, is still the likeliest, and as a draft costs one row.
        spelled = self._bridge.ll_tokenizer.tokenize_bytes(self._ll.compute_ff_bytes())
        if len(spelled) > len(tokens) and spelled[:len(tokens)] == tokens:
            tokens = spelled
        proposed = []
        for token in tokens[:limit]:
            if not self._plain(token):
                break
            proposed.append(token)
        return proposed[:self._ll.validate_tokens(proposed)] if proposed else []

    def masks_along(self, tokens: Sequence[int]) -> list[np.ndarray]:
        """allowed() here and after each leading token of `tokens` that is allowed: the masks
        of the rows of a verify pass that drafts those tokens. No state change."""
        count = self.valid_prefix(tokens)
        masks = [self.allowed()]
        consumed = 0
        try:
            for token in list(tokens)[:count]:
                self.consume(token)
                consumed += 1
                masks.append(self.allowed())
        finally:
            self.rollback(consumed)
        return masks

    # -- moves -----------------------------------------------------------------------------

    def consume(self, token: int) -> None:
        """Advance by `token`; ConstraintError (and no change) if it is not allowed."""
        token = int(token)
        if self._stopped:
            raise ConstraintError(f"token {token} after the stop token that ended the "
                                  f"{self.constraint.kind} constraint")
        if token in self._stop_set:
            if not self.complete:
                raise ConstraintError(f"stop token {token} before the text completes the "
                                      f"{self.constraint.kind} constraint")
            self._stopped = True
            self._tokens.append(token)
            return
        # The mask, where this position's is already computed, answers without llguidance.
        entry = self._masks[-1]
        allowed = bool(entry[0][token]) if entry is not None and 0 <= token < entry[0].size else \
            self._plain(token) and self._ll.validate_tokens([token]) == 1
        if not allowed or not self._plain(token):
            raise ConstraintError(f"token {token} is not allowed by the {self.constraint.kind} "
                                  f"constraint after {len(self._tokens)} tokens")
        if not self._ll.consume_token(token):
            raise ConstraintError(f"llguidance refused token {token} it had validated: "
                                  f"{self._ll.get_error()}")
        self._tokens.append(token)
        self._masks.append(None)

    def rollback(self, n: int) -> None:
        """Undo the last `n` tokens consumed."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or \
                not 0 <= n <= len(self._tokens):
            raise ConstraintError(f"rollback needs 0 <= n <= {len(self._tokens)} (the tokens "
                                  f"consumed), got {n!r}")
        n = int(n)
        if n == 0:
            return
        if self._stopped:
            self._stopped = False
            self._tokens.pop()
            n -= 1
        if n:
            self._rollback_ll(n)
            del self._tokens[-n:]

    def copy(self) -> ConstraintMatcher:
        """An independent matcher in the same state."""
        twin = ConstraintMatcher(self.constraint, self._bridge, self._ll.deep_copy(),
                                 self.vocab_size, self.stop_token_ids)
        twin._masks = list(self._masks)  # masks are read-only arrays: sharing them is safe
        twin._tokens = list(self._tokens)
        twin._stopped = self._stopped
        return twin

    # -- internals -------------------------------------------------------------------------

    def _plain(self, token: int) -> bool:
        """A token llguidance may see: inside both vocabularies, and not a stop token (nor
        llguidance's own eos, which ends its text)."""
        return 0 <= token < self._usable and token not in self._stop_set and \
            token != self._ll_eos

    def _rollback_ll(self, n: int) -> None:
        if not self._ll.rollback(n):
            raise ConstraintError(f"llguidance could not roll back {n} tokens: "
                                  f"{self._ll.get_error()}")
        del self._masks[-n:]

    def _mask_entry(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """This position's (mask, allowed ids, forbidden ids), computed on first use."""
        entry = self._masks[-1]
        if entry is None:
            entry = self._masks[-1] = self._compute_mask()
        return entry

    def _compute_mask(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """(allowed(), allowed_ids(), forbidden_ids()) at this position, all read-only."""
        if self._stopped or self._ll.is_error():
            mask = np.zeros(self.vocab_size, dtype=bool)
        else:
            words = self._words
            # The same bits compute_bitmask returns, written into the matcher's own buffer.
            self._ll.unsafe_compute_mask_ptr(self._words_at, words.nbytes)
            # unpackbits writes 0/1 bytes: a fresh array read as bool, padded where the
            # model's vocabulary is wider than the tokenizer's (those ids are never allowed).
            mask = np.unpackbits(words.view(np.uint8), count=self._usable,
                                 bitorder="little").view(np.bool_)
            if self._usable < self.vocab_size:
                mask = np.concatenate([mask, np.zeros(self.vocab_size - self._usable, bool)])
            if self._ll.is_error():  # the mask step ran out of its budget (ParserTooComplex)
                mask[:] = False
            if 0 <= self._ll_eos < self.vocab_size:
                mask[self._ll_eos] = False
            if self._stops.size:
                mask[self._stops] = self._ll.is_accepting()
        mask.flags.writeable = False
        count = np.count_nonzero(mask)
        ids = np.flatnonzero(mask) if count <= SPARSE_IDS else None
        banned = np.flatnonzero(~mask) if mask.size - count <= SPARSE_IDS else None
        for array in (ids, banned):
            if array is not None:
                array.flags.writeable = False
        return mask, ids, banned


def apply_mask(logits_row: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A float32 copy of `logits_row` with -inf at every id `allowed` forbids: SAMPLER.md's
    constraint processor. Refuses a mask that allows nothing (the generation must end first)."""
    row = np.asarray(logits_row, dtype=np.float32)  # np.where below makes the copy
    allowed = np.asarray(allowed)
    if row.ndim != 1 or allowed.shape != row.shape or allowed.dtype != np.bool_:
        raise ConstraintError(f"apply_mask needs a 1-D row and a bool mask of its shape, got "
                              f"{row.shape} and {allowed.dtype} {allowed.shape}")
    if not allowed.any():
        raise ConstraintError("the constraint allows no token here (an unsatisfiable state); "
                              "end the generation instead of drawing")
    return np.where(allowed, row, np.float32(-np.inf))
