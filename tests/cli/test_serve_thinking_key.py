"""`serve --thinking-key-file`: the server started from the command line checks given-back
thinking blocks under the key in the file (a block signed with it is served, one it signed
for another text refused, one signed with another key read as unsigned), and a file too
short or missing is refused by name before a model loads."""

from __future__ import annotations

import pytest

from exactdraft.cli import main
from exactdraft.server.reasoning.signatures import sign

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from tests.server.live import post, server_process  # noqa: E402

KEY = b"a key shared by the replicas of one service"


def with_thinking(signature: str) -> dict:
    return {"max_tokens": 2, "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Greet back.", "signature": signature},
            {"type": "text", "text": "Hello"}]},
        {"role": "user", "content": "Again"}]}


def test_the_server_checks_blocks_under_the_key_in_the_file(tiny_checkpoints, tmp_path):
    key_file = tmp_path / "thinking.key"
    key_file.write_bytes(KEY + b"\n")  # the final newline is not part of the key
    with server_process(tiny_checkpoints["llama"], "--backend", "torch",
                        "--thinking-key-file", str(key_file)) as base:
        status, reply = post(base, "/v1/messages", with_thinking(sign(KEY, "Greet back.")))
        assert status == 200, reply
        status, reply = post(base, "/v1/messages", with_thinking(sign(KEY, "Greet.")))
        assert status == 400, reply
        assert reply["error"]["param"] == "messages[1].content[0].signature"
        status, reply = post(base, "/v1/messages", with_thinking(sign(b"k" * 32, "Greet.")))
        assert status == 200, reply


def test_a_bad_key_file_is_refused_by_name(tmp_path, capsys):
    short = tmp_path / "short.key"
    short.write_bytes(b"too short\n")
    for path, words in ((short, "needs 16 bytes or more, the file holds 9"),
                        (tmp_path / "missing.key", "cannot read the thinking key file")):
        assert main(["serve", str(tmp_path / "no-model"),
                     "--thinking-key-file", str(path)]) != 0
        error = capsys.readouterr().err
        assert str(path) in error and words in error, error
