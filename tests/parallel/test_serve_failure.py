"""`serve --tensor-parallel 2` with rank 1 killed (SIGKILL), while a request runs and while idle:
/health answers 503 naming the rank within the heartbeat's bound, the running and new requests
get a 503 naming it (no hang), the launcher reaps the dead rank at once (no zombie) and exits
with the server's status for a failed engine (3); an idle server logs no c10d wait timeouts;
and SIGTERM stops the ranks in order, so the server writes its prefix-cache file as a one-rank
server does, and a restarted one starts from it."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.server.live import ROOT, post

pytest.importorskip("uvicorn", reason="the server extra is not installed")

# The heartbeat's stale_s (5 s) and two heartbeats, with room for a loaded machine.
DETECT_S = 15
# Then failure_exit_s (2 s) of 503s, uvicorn's shutdown and the launcher's reaping.
EXIT_S = 30
EXIT_ENGINE_FAILED = 3
LONG = {"model": "tiny", "prompt": "abc abc", "max_tokens": 900, "temperature": 0,
        "drafts": False, "logit_bias": {"2": -1e9}}


def read(base: str, path: str) -> tuple[int | str, str]:
    try:
        with urllib.request.urlopen(base + path, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return "down", str(error)


def environment_rank(pid: int) -> int | None:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        for item in handle.read().split(b"\0"):
            if item.startswith(b"RANK="):
                return int(item[5:])
    return None


def gone(pid: int) -> bool:
    """Whether `pid` is neither running nor a zombie (a zombie keeps its /proc entry)."""
    return not os.path.exists(f"/proc/{pid}")


def wait_until(condition: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def start(folder: str, stderr: Any, *options: str) -> tuple[subprocess.Popen, str, int]:
    """(launcher, base url, rank 1's pid) of `serve --tensor-parallel 2 OPTIONS`."""
    command = [sys.executable, "-m", "exactdraft", "serve", folder, "--backend", "torch",
               "--model-name", "tiny", "--tensor-parallel", "2", "--port", "0", *options]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    line = launcher.stdout.readline()
    assert " on http://" in line, f"the server did not start: {line!r}"
    with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children") as handle:
        children = [int(pid) for pid in handle.read().split()]
    victim = next(pid for pid in children if environment_rank(pid) == 1)
    return launcher, line.rsplit(" on ", 1)[1].strip(), victim


def check_failure_is_reported(launcher: subprocess.Popen, base: str, victim: int) -> None:
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    assert wait_until(lambda: gone(victim), 2), "the killed rank is left a zombie"
    assert wait_until(lambda: read(base, "/health")[0] == 503, DETECT_S)
    assert time.monotonic() - killed_at < DETECT_S
    status, body = read(base, "/health")
    assert status == 503 and "tensor parallel rank 1 is gone" in body, body
    started = time.monotonic()
    status, reply = post(base, "/v1/completions", {"model": "tiny", "prompt": "a",
                                                   "max_tokens": 2}, timeout=10)
    assert status == 503 and "rank 1 is gone" in reply["error"]["message"], reply
    assert time.monotonic() - started < 5  # refused, not queued
    assert launcher.wait(EXIT_S) == EXIT_ENGINE_FAILED


@pytest.mark.slow
def test_a_rank_killed_while_idle_makes_the_server_unhealthy_and_exit(tiny_checkpoints,
                                                                       tmp_path):
    errors = open(tmp_path / "stderr.txt", "w")  # noqa: SIM115  (closed below)
    launcher, base, victim = start(tiny_checkpoints["llama"], errors)
    try:
        assert read(base, "/health")[0] == 200
        time.sleep(5)  # idle: no c10d "waitForInput ... timed out" lines
        check_failure_is_reported(launcher, base, victim)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        errors.close()
    log = (tmp_path / "stderr.txt").read_text()
    assert "waitForInput" not in log, log
    assert "exactdraft: the server stopped: " in log and "rank 1 is gone" in log, log


@pytest.mark.slow
def test_a_rank_killed_during_a_request_fails_it_naming_the_rank(tiny_checkpoints):
    launcher, base, victim = start(tiny_checkpoints["llama"], subprocess.DEVNULL)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(post, base, "/v1/completions", LONG, 60)
            assert wait_until(lambda: '"running":1' in read(base, "/health")[1], 30)
            check_failure_is_reported(launcher, base, victim)
            status, reply = running.result(timeout=30)
        assert status == 503 and "rank 1 is gone" in reply["error"]["message"], reply
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def stop(launcher: subprocess.Popen) -> int:
    launcher.send_signal(signal.SIGTERM)
    try:
        return launcher.wait(EXIT_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@pytest.mark.slow
def test_sigterm_writes_the_prefix_cache_file_of_a_tensor_parallel_server(tiny_checkpoints,
                                                                          tmp_path):
    path = tmp_path / "prefixes.safetensors"
    request = {"model": "tiny", "prompt": list(range(3, 53)), "max_tokens": 4,
               "temperature": 0}
    launcher, base, _ = start(tiny_checkpoints["llama"], subprocess.DEVNULL,
                              "--prefix-cache-file", str(path))
    try:
        status, first = post(base, "/v1/completions", request)
        assert status == 200 and first["choices"][0]["receipt"]["prefix_cache"] == "cold"
    finally:
        assert stop(launcher) == 0
    assert path.exists(), "SIGTERM did not write the cache file"
    launcher, base, _ = start(tiny_checkpoints["llama"], subprocess.DEVNULL,
                              "--prefix-cache-file", str(path))
    try:
        status, again = post(base, "/v1/completions", request)
    finally:
        stop(launcher)
    assert status == 200 and again["choices"][0]["receipt"]["prefix_cache"] == "file", again
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 48
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
