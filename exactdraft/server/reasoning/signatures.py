"""Signatures of Anthropic `thinking` blocks: each block the server sends carries an HMAC-SHA256
of its thinking text under the server's key, and a block given back in a later request is read
only if its signature verifies, as Anthropic's API refuses a thinking block that was changed.

Invariant: a signature verifies exactly when it was made by `sign` under the same key for the
same thinking text; the comparison takes the same time wherever the signatures differ. The key
is the server's (`thinking_key`), by default random for each server, so a signature made by
another server process, or under another key, does not verify. A block given back without a
signature (a history written by hand) is read as it is.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets

from exactdraft.engine.cache_file import MIN_KEY_BYTES, read_key
from exactdraft.errors import ParameterError

KEY_BYTES = 32  # the size of a random key


def thinking_key(key: bytes | None) -> bytes:
    """The key signatures are made with: `key`, checked to be bytes of at least
    MIN_KEY_BYTES, or a random one when None."""
    if key is None:
        return secrets.token_bytes(KEY_BYTES)
    if not isinstance(key, bytes):
        raise ParameterError(f"thinking_key must be bytes, got {type(key).__name__}")
    if len(key) < MIN_KEY_BYTES:
        raise ParameterError(f"thinking_key must be at least {MIN_KEY_BYTES} bytes, got "
                             f"{len(key)}")
    return key


def read_thinking_key(path: str | os.PathLike[str]) -> bytes:
    """The key held in the file at `path` (its bytes, less a final newline): at least
    MIN_KEY_BYTES, else ParameterError naming the file."""
    return read_key(path, "thinking key", ParameterError)


def sign(key: bytes, thinking: str) -> str:
    """The signature of a thinking text: its HMAC-SHA256 under `key`, in base64 (a lone
    surrogate a client may send is signed as its code point)."""
    digest = hmac.new(key, thinking.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def verifies(key: bytes, thinking: str, signature: str) -> bool:
    """Whether `signature` is the signature of `thinking` under `key`."""
    return hmac.compare_digest(sign(key, thinking).encode("ascii"),
                               signature.encode("utf-8", "surrogatepass"))
