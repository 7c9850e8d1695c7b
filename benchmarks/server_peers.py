"""Two OpenAI-compatible servers at the same concurrency: exactdraft's and llama.cpp's
(llama-cpp-python[server]), the same requests to each, for serve_bench.py's part 5.

Each server gets the same `streams` chat requests (distinct prompts and seeds, temperature
0.7, non-streamed): first one after another (solo), then all at once from `streams` client
threads (concurrent). Reported per server: completion tokens per second of wall time solo and
concurrent (usage.completion_tokens over the span from the first request sent to the last
reply), their ratio, and whether every concurrent reply has the text of its solo reply; and
the two servers' concurrent throughput ratio. llama.cpp's server runs in a subprocess of the
interpreter given with --llama-python, on the same GGUF file and thread count.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

STARTUP_SECONDS = 180


def post(base: str, body: dict) -> dict:
    """The JSON reply of one non-streamed chat completion."""
    request = urllib.request.Request(base + "/v1/chat/completions",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def timed_replies(base: str, bodies: list[dict], concurrent: bool) -> tuple[list[dict], float]:
    """(replies in request order, seconds from the first request to the last reply)."""
    started = time.perf_counter()
    if concurrent:
        with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
            replies = list(pool.map(lambda body: post(base, body), bodies))
    else:
        replies = [post(base, body) for body in bodies]
    return replies, time.perf_counter() - started


def side(base: str, bodies: list[dict]) -> dict:
    """One server's solo and concurrent throughput and whether its replies agree."""
    post(base, {**bodies[0], "max_tokens": 4})  # warm-up
    solo, solo_seconds = timed_replies(base, bodies, concurrent=False)
    together, together_seconds = timed_replies(base, bodies, concurrent=True)

    def tokens(replies: list[dict]) -> int:
        return sum(reply["usage"]["completion_tokens"] for reply in replies)

    def text(reply: dict) -> str:
        return reply["choices"][0]["message"]["content"]

    identical = [text(a) == text(b) for a, b in zip(together, solo)]
    single = tokens(solo) / solo_seconds
    aggregate = tokens(together) / together_seconds
    return {"solo_tokens_per_second": single, "concurrent_tokens_per_second": aggregate,
            "ratio": aggregate / single, "completion_tokens": tokens(together),
            "identical": identical, "all_identical": all(identical)}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def llama_server(python: str, model: str, threads: int, context: int) -> Iterator[str]:
    """The base URL of a llama-cpp-python server on 127.0.0.1, stopped on exit."""
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")  # a pipe nobody reads would fill and stall it
    process = subprocess.Popen(
        [python, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1",
         "--port", str(port), "--n_threads", str(threads), "--n_threads_batch", str(threads),
         "--n_ctx", str(context)],
        stdout=log, stderr=subprocess.STDOUT, text=True, cwd="/")
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"llama.cpp's server exited: {log.read()[-1500:]}")
            try:
                with urllib.request.urlopen(base + "/v1/models", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"llama.cpp's server did not answer in "
                                       f"{STARTUP_SECONDS} s") from None
                time.sleep(0.5)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@contextmanager
def exactdraft_server(generator: Any, streams: int, prefix_cache_bytes: int | None = 0,
                      name: str = "bench") -> Iterator[str]:
    """The base URL of an exactdraft server for `generator` on 127.0.0.1, stopped on exit
    (`prefix_cache_bytes`: as exactdraft.server.build takes it; none by default)."""
    from exactdraft.server import bound_address, build

    served = build(generator, name, port=0, max_sequences=streams,
                   prefix_cache_bytes=prefix_cache_bytes)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    try:
        while not served.started:
            if not thread.is_alive():
                raise RuntimeError("the exactdraft server did not start")
            time.sleep(0.02)
        host, port = bound_address(served)
        yield f"http://{host}:{port}"
    finally:
        served.should_exit = True
        thread.join(timeout=60)


def compare(generator: Any, model: str, python: str, threads: int,
            requests: list[tuple[list[dict], int]], tokens: int) -> dict:
    """Both servers on the same (messages, seed) requests: each side's figures and the
    exactdraft / llama.cpp concurrent throughput ratio."""
    bodies = [{"model": "bench", "messages": messages, "max_tokens": tokens,
               "temperature": 0.7, "seed": seed} for messages, seed in requests]
    with exactdraft_server(generator, len(bodies)) as base:
        ours = side(base, bodies)
    context = 512 * len(bodies)
    with llama_server(python, model, threads, context) as base:
        theirs = side(base, bodies)
    return {"streams": len(bodies), "max_tokens": tokens, "exactdraft": ours, "llama_cpp": theirs,
            "concurrent_throughput_ratio": ours["concurrent_tokens_per_second"] /
            theirs["concurrent_tokens_per_second"]}
