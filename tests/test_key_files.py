"""Key files: a key is the file's bytes less a final newline; a short key or a file that cannot
be read is refused with the caller's error class, naming the file and what the key is for."""

from __future__ import annotations

import pytest

from exactdraft.engine.cache_file import CacheFileError
from exactdraft.errors import ParameterError
from exactdraft.key_files import MIN_KEY_BYTES, read_key

KEY = b"k" * 32


def test_a_key_file_is_read_and_a_short_one_refused(tmp_path):
    (tmp_path / "key").write_bytes(KEY + b"\n")
    assert read_key(tmp_path / "key", "cache key", CacheFileError) == KEY
    (tmp_path / "short").write_bytes(b"abc\n")
    with pytest.raises(CacheFileError, match="16 bytes or more, the file holds 3"):
        read_key(tmp_path / "short", "cache key", CacheFileError)
    with pytest.raises(CacheFileError, match="cannot read the cache key file"):
        read_key(tmp_path / "absent", "cache key", CacheFileError)
    (tmp_path / "edge").write_bytes(b"e" * MIN_KEY_BYTES)
    assert read_key(tmp_path / "edge", "thinking key", ParameterError) == b"e" * MIN_KEY_BYTES
    (tmp_path / "one short").write_bytes(b"e" * (MIN_KEY_BYTES - 1))
    with pytest.raises(ParameterError, match="a thinking key needs 16 bytes"):
        read_key(tmp_path / "one short", "thinking key", ParameterError)
