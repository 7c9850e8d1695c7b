"""The prefix-cache file's location and integrity: a location that cannot be written is refused
at once; a file is bound to the weights, the arithmetic and the model settings; with a key, a
file whose keys and values were edited and whose recorded sha256 was recomputed (what anyone
who can write the file can do) is refused, while the same file loads without a key (the
sha256 alone cannot catch it: the control)."""

from __future__ import annotations

import os
import stat
import tempfile

import numpy as np
import pytest

from exactdraft.engine import PrefixCache, load_prefix_cache, save_prefix_cache
from exactdraft.engine.cache_file import (
    CacheFileError,
    _content_digest,
    check_location,
)
from tests.engine.test_prefix_cache import filled_cache

KEY = b"k" * 32


def forge(path) -> None:
    """Double the values of the first block and record the new sha256, leaving the rest of
    the header (its signature included) as it was."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with safe_open(str(path), framework="np") as handle:
        metadata = handle.metadata()
    tensors = load_file(str(path))
    tensors["0.values"] = tensors["0.values"] * np.float32(2.0)
    metadata["sha256"] = _content_digest(tensors)
    save_file(tensors, str(path), metadata=metadata)


def test_a_forged_file_is_refused_with_the_key_and_only_with_it(tiny_targets, tmp_path):
    target = tiny_targets["qwen2"]
    path = tmp_path / "prefixes.safetensors"
    save_prefix_cache(filled_cache(target), path, target, KEY)
    assert load_prefix_cache(PrefixCache(block_tokens=8), path, target, KEY) == 5
    forge(path)
    with pytest.warns(RuntimeWarning, match="not signed with this server's key"):
        assert load_prefix_cache(PrefixCache(block_tokens=8), path, target, KEY) == 0
    # Without a key the recomputed sha256 passes: the file is as trusted as its folder.
    unchecked = PrefixCache(block_tokens=8)
    assert load_prefix_cache(unchecked, path, target) == 5
    with pytest.warns(RuntimeWarning, match="not signed with this server's key"):
        assert load_prefix_cache(PrefixCache(block_tokens=8), path, target, b"x" * 32) == 0


def test_a_file_of_other_model_settings_is_ignored(tiny_targets, tmp_path):
    target = tiny_targets["qwen2"]
    path = tmp_path / "prefixes.safetensors"
    save_prefix_cache(filled_cache(target), path, target)

    class OtherContext:  # the same weights and arithmetic, a shorter context
        def __getattr__(self, name):
            return getattr(target, name)

        max_context = target.max_context // 2

    with pytest.warns(RuntimeWarning, match="settings is"):
        assert load_prefix_cache(PrefixCache(block_tokens=8), path, OtherContext()) == 0
    assert load_prefix_cache(PrefixCache(block_tokens=8), path, target) == 5  # the control


def test_a_location_that_cannot_be_written_is_refused(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "plain").write_text("")
    with pytest.raises(CacheFileError, match="is a folder"):
        check_location(tmp_path / "folder")
    with pytest.raises(CacheFileError, match="does not exist"):
        check_location(tmp_path / "missing" / "prefixes.safetensors")
    with pytest.raises(CacheFileError, match="does not exist"):  # a file is no folder
        check_location(tmp_path / "plain" / "prefixes.safetensors")
    check_location(tmp_path / "prefixes.safetensors")  # the control
    assert sorted(os.listdir(tmp_path)) == ["folder", "plain"]  # the probe file is gone


def test_a_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        try:  # the premise: this process cannot create a file there (root can)
            handle, probe = tempfile.mkstemp(dir=folder)
        except PermissionError:
            pass
        else:
            os.close(handle)
            os.remove(probe)
            pytest.skip("this process writes in a read-only folder (it runs as root): the "
                        "folder is writable to it, so there is nothing to refuse")
        with pytest.raises(CacheFileError, match="cannot write in"):
            check_location(folder / "prefixes.safetensors")
    finally:
        folder.chmod(stat.S_IRWXU)
