"""Operating a live server: /health, the bounded queue (429 when full, every accepted request
still answered) and clients that go away (their sequences are freed, mid-stream or while
waiting for a whole response). The server here has one sequence and two queue places, and
every pass of its target pauses first (the pause releases the GIL, as the C kernels do), so a
long request runs for many seconds unless it is cancelled, whatever drafting or the machine's
load does to its speed."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

import exactdraft as xd
from tests.server.conftest import MODEL
from tests.server.live import get, post, server_in_thread

PAUSE_SECONDS = 0.05  # before every pass, so per token
WAIT_SECONDS = 10  # for the server to react to a client that went away
USER = [{"role": "user", "content": "abc abc"}]
# Greedy: the tiny model writes 348 tokens before its eos here (over 17 s of pauses), 900 with
# eos banned (OpenAI's logit_bias; /v1/messages ignores the field).
LONG = {"model": MODEL, "messages": USER, "max_tokens": 900, "temperature": 0,
        "logit_bias": {"2": -1e9}}
QUICK = {"model": MODEL, "messages": USER, "max_tokens": 2}


def paused(run: Callable[..., Any]) -> Callable[..., Any]:
    """`run`, starting with a pause of PAUSE_SECONDS (its results are unchanged)."""
    def run_after_a_pause(*args: Any, **options: Any) -> Any:
        time.sleep(PAUSE_SECONDS)
        return run(*args, **options)

    return run_after_a_pause


@pytest.fixture(scope="module")
def slow(tiny_checkpoints: dict[str, str]) -> Iterator[tuple[str, Any, Any]]:
    """(base url, engine, generator) of a server with max_sequences=1, max_waiting=2, whose
    target pauses before every pass."""
    generator = xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch",
                                             progress=False)
    target = generator.target
    target.forward, target.forward_batch = paused(target.forward), paused(target.forward_batch)
    with server_in_thread(generator, MODEL, max_sequences=1, max_waiting=2) as (base, engine):
        yield base, engine, generator


def wait_for(condition: Callable[[], bool], seconds: float = WAIT_SECONDS) -> bool:
    """Whether `condition()` came true within `seconds` (polled)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_health_reports_the_model_and_the_engine_limits(slow) -> None:
    """/health answers with the served model, an idle engine and its configured bounds."""
    base, _, _ = slow
    health = get(base, "/health")
    assert health["status"] == "ok" and health["model"] == MODEL
    assert (health["running"], health["waiting"]) == (0, 0)
    assert (health["max_sequences"], health["max_waiting"]) == (1, 2)


def test_a_full_queue_answers_429_and_serves_what_it_accepted(slow) -> None:
    """With the engine held (its generator's lock taken), six concurrent requests fill the two
    queue places and the other four get 429 in their API's error format; once the engine runs
    again, both queued requests and a fresh one are answered 200."""
    base, engine, generator = slow
    paths = ["/v1/chat/completions", "/v1/messages"] * 3
    with concurrent.futures.ThreadPoolExecutor(len(paths)) as pool:
        with generator.lock:
            futures = [pool.submit(post, base, path, QUICK) for path in paths]
            refused = []
            for future in concurrent.futures.as_completed(futures, timeout=60):
                refused.append((futures.index(future), *future.result()))
                if len(refused) == 4:
                    break
            assert engine.load == (0, 2)
        answered = [future.result(timeout=60) for future in futures]
    for index, status, body in refused:
        assert status == 429, body
        error = body["error"]
        assert error["type"] == "rate_limit_error" and "max_waiting" in error["message"]
        assert ("type" in body) == (paths[index] == "/v1/messages")
    assert sorted(status for status, _ in answered) == [200, 200, 429, 429, 429, 429]
    assert post(base, "/v1/chat/completions", QUICK)[0] == 200


def open_request(base: str, path: str, body: dict[str, Any]) -> socket.socket:
    """A socket that has sent a POST of `body` to `path` (the response is left unread)."""
    address = urlsplit(base)
    connection = socket.create_connection((address.hostname, address.port), timeout=60)
    data = json.dumps(body).encode()
    connection.sendall(f"POST {path} HTTP/1.1\r\nHost: {address.netloc}\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                       f"\r\n".encode() + data)
    return connection


@pytest.mark.parametrize("path, stream", [("/v1/chat/completions", True),
                                          ("/v1/chat/completions", False),
                                          ("/v1/messages", True), ("/v1/messages", False)])
def test_a_client_that_goes_away_frees_its_sequence(slow, path: str, stream: bool) -> None:
    """A long request whose client closes its connection (after the first streamed tokens,
    or while its whole response is being computed) is cancelled: the engine counts one more
    cancelled sample and is back to no running or waiting sequences long before the request
    could have finished, and the next request is served."""
    base, engine, _ = slow
    cancelled = engine.stats.cancelled
    connection = open_request(base, path, {**LONG, "stream": stream})
    try:
        if stream:
            received = b""
            while b"text_delta" not in received and b'"content": "' not in received:
                piece = connection.recv(65536)
                assert piece, f"the stream ended early: {received[-300:]!r}"
                received += piece
            assert received.startswith(b"HTTP/1.1 200")
        else:
            assert wait_for(lambda: engine.load == (1, 0)), engine.load
    finally:
        connection.close()
    assert wait_for(lambda: engine.load == (0, 0)), engine.load
    assert engine.stats.cancelled == cancelled + 1
    assert get(base, "/health")["cancelled"] == cancelled + 1
    assert post(base, path, QUICK)[0] == 200


def test_metrics_gauges_follow_the_engine(slow) -> None:
    """While a long request runs, /metrics reports one running sequence and the positions it
    holds as a share of the engine's room (one sequence of the 1024-token context here); once
    its client goes away, both are back to zero."""
    from tests.server.test_metrics import scrape

    base, engine, _ = slow
    connection = open_request(base, "/v1/chat/completions", {**LONG, "stream": True})
    try:
        received = b""
        while received.count(b'"content": "') < 3:
            piece = connection.recv(65536)
            assert piece, f"the stream ended early: {received[-300:]!r}"
            received += piece
        samples = scrape(base)
        assert samples["vllm:num_requests_running"] == 1
        assert samples["vllm:num_requests_waiting"] == 0
        assert 3 / 1024 < samples["vllm:kv_cache_usage_perc"] < 1
    finally:
        connection.close()
    assert wait_for(lambda: engine.load == (0, 0)), engine.load
    samples = scrape(base)
    assert samples["vllm:num_requests_running"] == 0
    assert samples["vllm:kv_cache_usage_perc"] == 0
