"""A server's prefix-cache file end to end: the receipt names where a prompt's prefix came from
(cold, memory, file), every reply equal to the cold one; a file signed with the server's key is
used after a restart; one whose keys and values were edited and whose recorded sha256 was
recomputed is ignored with a warning and the reply equals a cold server's; a location that
cannot be written is refused when the server is built."""

from __future__ import annotations

import shutil

import pytest

from exactdraft.engine import CacheFileError
from tests.engine.test_cache_file import KEY, forge
from tests.server.conftest import MODEL
from tests.server.live import post, server_in_thread

PROMPT = list(range(3, 53))  # 50 token ids: three whole blocks of 16 to cache
REQUEST = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0.8, "seed": 3,
           "logprobs": 1}


def ask(base: str) -> tuple[dict, int]:
    """(the choice, its cached prompt tokens)."""
    status, reply = post(base, "/v1/completions", REQUEST)
    assert status == 200, reply
    return reply["choices"][0], reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def same_output(choice: dict, cold: dict) -> bool:
    return (choice["text"], choice["logprobs"], choice["receipt"]["token_ids_sha256"]) == \
        (cold["text"], cold["logprobs"], cold["receipt"]["token_ids_sha256"])


def test_the_receipt_names_the_cache_state_and_a_forged_file_is_ignored(served_generator,
                                                                         tmp_path):
    path = tmp_path / "prefixes.safetensors"
    options = dict(prefix_cache_file=str(path), prefix_cache_key=KEY)
    with pytest.warns(RuntimeWarning, match="not a readable safetensors"):  # none yet
        serving = server_in_thread(served_generator, MODEL, **options)
        base, _ = serving.__enter__()
    try:
        cold, cached = ask(base)
        assert cold["receipt"]["prefix_cache"] == "cold" and cached == 0
        warm, cached = ask(base)
        assert warm["receipt"]["prefix_cache"] == "memory" and cached == 48
        assert same_output(warm, cold)
    finally:
        serving.__exit__(None, None, None)
    assert path.exists()  # written on shutdown
    forged = tmp_path / "forged.safetensors"
    shutil.copy(path, forged)
    forge(forged)

    with server_in_thread(served_generator, MODEL, **options) as (base, _):
        restarted, cached = ask(base)
    assert restarted["receipt"]["prefix_cache"] == "file" and cached == 48
    assert same_output(restarted, cold)

    with pytest.warns(RuntimeWarning, match="not signed with this server's key"):
        serving = server_in_thread(served_generator, MODEL, prefix_cache_file=str(forged),
                                   prefix_cache_key=KEY)
        base, _ = serving.__enter__()
    try:
        after_forgery, cached = ask(base)
    finally:
        serving.__exit__(None, None, None)
    assert after_forgery["receipt"]["prefix_cache"] == "cold" and cached == 0
    assert same_output(after_forgery, cold)

    # The control: without a key the forged file passes its recomputed sha256, is used, and
    # changes the reply (what the key is for). The server above wrote its own cache over the
    # forged file on shutdown, so it is forged again.
    shutil.copy(path, forged)
    forge(forged)
    with server_in_thread(served_generator, MODEL, prefix_cache_file=str(forged)) as (base, _):
        unchecked, cached = ask(base)
    assert unchecked["receipt"]["prefix_cache"] == "file" and cached == 48
    assert not same_output(unchecked, cold)


@pytest.mark.parametrize("where, says", [("folder", "is a folder"),
                                         ("plain/prefixes.safetensors", "does not exist")])
def test_a_cache_location_that_cannot_be_written_is_refused_at_start(served_generator,
                                                                     tmp_path, where, says):
    from exactdraft.server import build

    (tmp_path / "folder").mkdir()
    (tmp_path / "plain").write_text("")
    with pytest.raises(CacheFileError, match=says):
        build(served_generator, MODEL, port=0, prefix_cache_file=str(tmp_path / where))
