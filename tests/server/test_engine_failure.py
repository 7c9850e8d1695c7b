"""A server whose engine fails (here one rank, a target whose pass raises on a later pass) says
so at once and exits: the running request gets a 503 naming the cause, /health answers 503
with it, /metrics' engine gauge reads 0, a new request gets a 503 (not a hang), and `serve`
returns by raising the EngineFailed within the exit delay, so the process exits non-zero."""

from __future__ import annotations

import itertools
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

import exactdraft as xd
from exactdraft.engine import Engine, EngineFailed
from tests.server.conftest import MODEL
from tests.server.live import post

BROKEN = "the device was lost on purpose"
GOOD_PASSES = 3
EXIT_S = 1.0
# A greedy request that runs well past GOOD_PASSES passes (eos banned, serial: one token a pass).
LONG = {"model": MODEL, "prompt": "abc abc", "max_tokens": 40, "temperature": 0,
        "drafts": False, "logit_bias": {"2": -1e9}}


def read(base: str, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(base + path, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def failing_generator(folder: str) -> Any:
    """A generator whose target's passes raise from pass GOOD_PASSES on."""
    generator = xd.Generator.from_pretrained(folder, "torch", progress=False)
    target, passes = generator.target, itertools.count()
    original = target.forward_batch

    def forward_batch(*args: Any, **options: Any) -> Any:
        if next(passes) >= GOOD_PASSES:
            raise RuntimeError(BROKEN)
        return original(*args, **options)

    target.forward_batch = forward_batch
    return generator


def test_a_failing_pass_makes_the_server_unhealthy_and_exit(tiny_checkpoints) -> None:
    from exactdraft.server import serve

    generator = failing_generator(tiny_checkpoints["llama"])
    bound: list[tuple[str, int]] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            serve(generator, MODEL, host="127.0.0.1", port=0, ready=bound.append,
                  failure_exit_s=EXIT_S)
        except BaseException as error:  # noqa: BLE001  (what the test inspects)
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not bound:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    base = f"http://{bound[0][0]}:{bound[0][1]}"
    assert read(base, "/health")[0] == 200

    status, body = post(base, "/v1/completions", LONG, timeout=60)
    assert status == 503, body
    assert BROKEN in body["error"]["message"], body
    failed_at = time.monotonic()
    status, health = read(base, "/health")
    assert status == 503 and BROKEN in health.decode(), health
    if xd.server.metrics.available():
        assert b"exactdraft:engine_healthy{model_name=\"tiny-llama\"} 0.0" in \
            read(base, "/metrics")[1]
    status, body = post(base, "/v1/chat/completions",
                        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                        timeout=10)
    assert status == 503 and BROKEN in body["error"]["message"], body

    thread.join(timeout=EXIT_S + 30)
    assert not thread.is_alive(), "the server did not exit after its engine failed"
    assert time.monotonic() - failed_at < EXIT_S + 30
    assert len(raised) == 1 and isinstance(raised[0], EngineFailed), raised
    assert BROKEN in str(raised[0])


def test_an_engine_whose_loop_raises_fails_every_request_and_refuses_new_ones(
        tiny_checkpoints) -> None:
    """The scheduling loop itself raising (here a target whose new_state raises): the waiting
    request fails with EngineFailed naming the cause, on_failure is called once, and submit
    refuses at once."""
    generator = xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch", progress=False)

    def new_state() -> Any:
        raise MemoryError("no room for a state, on purpose")

    generator.target.new_state = new_state
    seen: list[EngineFailed] = []
    with Engine(generator, max_sequences=2, on_failure=seen.append) as engine:
        submission = engine.submit("abc", max_new_tokens=4)
        with pytest.raises(EngineFailed, match="MemoryError: no room for a state"):
            submission.results(timeout=60)
        assert len(seen) == 1 and engine.failure is seen[0]
        with pytest.raises(EngineFailed, match="no room for a state"):
            engine.submit("abc", max_new_tokens=4)


def test_a_failing_pass_fails_the_running_and_the_queued_request(tiny_checkpoints) -> None:
    """One sequence at a time: the running request and the one queued behind it both fail
    with the pass's error, and nothing is left waiting."""
    generator = failing_generator(tiny_checkpoints["llama"])
    with Engine(generator, max_sequences=1) as engine:
        with generator.lock:  # both are queued before the first pass
            running = engine.submit("abc abc", max_new_tokens=40, drafts=False,
                                    stop_tokens=[])
            queued = engine.submit("abc", max_new_tokens=4)
            assert engine.load == (0, 2)
        for submission in (running, queued):
            with pytest.raises(EngineFailed, match=BROKEN):
                submission.results(timeout=60)
        assert engine.load == (0, 0) and isinstance(engine.failure, EngineFailed)
