"""Signing keys kept in files (the prefix-cache key, the thinking-block key).

Invariant: a key read from a file is the file's bytes less a final newline and holds at least
MIN_KEY_BYTES; any other file is refused with the caller's error class, naming the file and
what the key is for.
"""

from __future__ import annotations

import os

MIN_KEY_BYTES = 16


def read_key(path: str | os.PathLike[str], what: str,
             error_class: type[Exception]) -> bytes:
    """The signing key held in the file at `path` (its bytes, less a final newline): at least
    MIN_KEY_BYTES, else `error_class` naming the file and `what` the key is."""
    try:
        with open(path, "rb") as handle:
            key = handle.read().rstrip(b"\r\n")
    except OSError as error:
        raise error_class(f"{os.fspath(path)}: cannot read the {what} file "
                          f"({error.strerror})") from None
    if len(key) < MIN_KEY_BYTES:
        raise error_class(f"{os.fspath(path)}: a {what} needs {MIN_KEY_BYTES} bytes or "
                          f"more, the file holds {len(key)}")
    return key
