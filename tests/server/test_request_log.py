"""The request log: one line per request on logger `exactdraft.server` (method, path, status,
prompt, cached and completion tokens, drafted and accepted, milliseconds), whole, streamed or
refused; probes and scrapes only at DEBUG."""

from __future__ import annotations

import logging
import re
import time

from tests.server.conftest import MODEL
from tests.server.live import get, post, server_process
from tests.server.test_metrics import streamed

USER = [{"role": "user", "content": "abc abc abc"}]
LINE = re.compile(r"^(\w+) (\S+) (\d+) prompt=(\d+) cached=(\d+) completion=(\d+) "
                  r"drafted=(\d+) accepted=(\d+) ms=(\d+\.\d)$")


def lines(caplog, level: int = logging.INFO) -> list[tuple]:
    found = []
    for record in caplog.records:
        if record.name == "exactdraft.server" and record.levelno == level:
            match = LINE.match(record.getMessage())
            assert match, record.getMessage()
            found.append(match.groups())
    return found


def wait_for_lines(caplog, count: int) -> list[tuple]:
    deadline = time.monotonic() + 10
    while len(lines(caplog)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return lines(caplog)


def test_one_line_per_request(live, caplog) -> None:
    base, _ = live
    caplog.set_level(logging.DEBUG, logger="exactdraft.server")
    status, reply = post(base, "/v1/chat/completions", {
        "model": MODEL, "messages": USER, "max_tokens": 16, "temperature": 0.7, "seed": 1})
    assert status == 200
    # A fixed seed: under a fresh one the sample may draw </s> before max_tokens (about one
    # request in thirty here), and the counts below would rightly be fewer than 8.
    events = streamed(base, {"model": MODEL, "messages": USER, "max_tokens": 8,
                             "stream": True, "seed": 1})
    assert post(base, "/v1/messages", {"model": MODEL, "messages": USER})[0] == 400
    get(base, "/health")
    found = wait_for_lines(caplog, 3)
    assert len(found) == 3, found
    receipt, usage = reply["choices"][0]["receipt"], reply["usage"]
    method, path, code, prompt, cached, completion, drafted, accepted, ms = found[0]
    assert (method, path, code) == ("POST", "/v1/chat/completions", "200")
    assert (int(prompt), int(completion)) == (usage["prompt_tokens"],
                                              usage["completion_tokens"])
    assert (int(drafted), int(accepted)) == (receipt["drafted"], receipt["accepted"])
    assert float(ms) > 0
    delta = next(e for e in events if e["type"] == "message_delta")
    assert found[1][:3] == ("POST", "/v1/messages", "200")
    assert int(found[1][5]) == delta["usage"]["output_tokens"] == 8
    assert found[2][:3] == ("POST", "/v1/messages", "400")
    assert found[2][3:8] == ("0",) * 5
    assert [g[:3] for g in lines(caplog, logging.DEBUG)] == [("GET", "/health", "200")]


def test_a_stream_that_ends_at_a_stop_token_logs_what_it_sent(live, caplog) -> None:
    """A sample that draws </s> before max_tokens: its line counts the tokens the stream
    reported, not max_tokens."""
    base, _ = live
    caplog.set_level(logging.INFO, logger="exactdraft.server")
    events = streamed(base, {"model": MODEL, "messages": USER, "max_tokens": 8,
                             "stream": True, "seed": 43})
    delta = next(e for e in events if e["type"] == "message_delta")
    # This seed's sample ends at </s> early, so the count differs from max_tokens.
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert 0 < delta["usage"]["output_tokens"] < 8
    found = wait_for_lines(caplog, 1)
    assert [line[:3] for line in found] == [("POST", "/v1/messages", "200")]
    assert int(found[0][5]) == delta["usage"]["output_tokens"]
    assert (int(found[0][6]), int(found[0][7])) == (delta["receipt"]["drafted"],
                                                    delta["receipt"]["accepted"])


def test_serve_log_level_and_model_alias_flags(tiny_checkpoints, tmp_path) -> None:
    """`exactdraft serve --log-level info` writes each request's line on stderr, and not the
    probes' (DEBUG); `--model-alias` names are listed and served, other names refused."""
    path = tmp_path / "stderr.log"
    with open(path, "w") as stderr:
        with server_process(tiny_checkpoints["llama"], "--backend", "torch", "--log-level",
                            "info", "--model-name", "tiny", "--model-alias", "gpt-4o",
                            "--model-alias", "claude=tiny", stderr=stderr) as base:
            for model in ("gpt-4o", "claude"):
                assert post(base, "/v1/completions", {"model": model, "prompt": "abc",
                                                      "max_tokens": 2})[0] == 200
            assert post(base, "/v1/completions", {"model": "gpt-5", "prompt": "abc"})[0] == 404
            assert [m["id"] for m in get(base, "/v1/models")["data"]] == \
                ["tiny", "claude", "gpt-4o"]
            get(base, "/health")
    text = path.read_text()
    assert text.count("exactdraft.server: POST /v1/completions 200 prompt=") == 2, text[-2000:]
    assert text.count("exactdraft.server: POST /v1/completions 404 prompt=0") == 1
    assert "/health" not in text and "/v1/models" not in text
