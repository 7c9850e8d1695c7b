"""Signatures of Anthropic `thinking` blocks: each block the server sends carries a signature
`xd1.<key id>.<mac>`, the key id being the first 8 bytes of the SHA-256 of the server's key (in
hex) and the mac the HMAC-SHA256 of the thinking text under that key (in base64).

Invariant: a block given back is refused (`was_changed`) only when its signature is in this
format, carries this server's key id and its mac does not verify for the block's thinking text:
a block this server signed and the client then changed. Any other signature (another key id: a
restarted server without a shared key, another replica; another format: Anthropic's own API) is
read as unsigned, as is a block without one. The mac comparison takes the same time wherever the
macs differ.

What the check is: it catches a thinking block that this server signed and that was changed
since; it is not a security boundary, since a client may drop the signature, or send a block
with a signature of another format, and the block is then read as written by hand.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets

from exactdraft.errors import ParameterError
from exactdraft.key_files import MIN_KEY_BYTES, read_key

KEY_BYTES = 32  # the size of a random key
VERSION = "xd1"


def checked_key_or_random(key: bytes | None) -> bytes:
    """The key signatures are made with: `key`, checked to be bytes of at least
    MIN_KEY_BYTES, or a random one of KEY_BYTES when None."""
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


def key_id(key: bytes) -> str:
    """The id a signature names its key by: the first 8 bytes of the key's SHA-256, in hex."""
    return hashlib.sha256(key).digest()[:8].hex()


def _mac(key: bytes, thinking: str) -> str:
    # A lone surrogate a client may send is signed as its code point.
    digest = hmac.new(key, thinking.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def sign(key: bytes, thinking: str) -> str:
    """The signature of a thinking text under `key`: `xd1.<key id>.<base64 HMAC-SHA256>`."""
    return f"{VERSION}.{key_id(key)}.{_mac(key, thinking)}"


def is_ours(key: bytes, signature: str) -> bool:
    """Whether `signature` is in this server's format and names `key`'s id (whatever its mac)."""
    parts = signature.split(".")
    return len(parts) == 3 and parts[0] == VERSION and parts[1] == key_id(key)


def verifies(key: bytes, thinking: str, signature: str) -> bool:
    """Whether `signature` is the signature of `thinking` under `key`."""
    return hmac.compare_digest(sign(key, thinking).encode("ascii"),
                               signature.encode("utf-8", "surrogatepass"))


def was_changed(key: bytes, thinking: str, signature: str) -> bool:
    """Whether a block given back with `signature` was signed under `key` for another thinking
    text: a signature in this format with `key`'s id that does not verify. Any other
    signature is not this server's to check (read as unsigned)."""
    return is_ours(key, signature) and not verifies(key, thinking, signature)
