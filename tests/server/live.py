"""Live servers for the tests: one in a thread of the test process, or one in its own process
through the command line; both listen on 127.0.0.1 on a free port and are stopped by the test."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

STARTUP_SECONDS = 120
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@contextlib.contextmanager
def server_in_thread(generator: Any, model_name: str, **options: Any) -> Iterator[Any]:
    """(base url, engine) of a server running in a thread until the block ends."""
    from exactdraft.server import bound_address, build

    server = build(generator, model_name, host="127.0.0.1", port=0, **options)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_SECONDS
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    host, port = bound_address(server)
    try:
        yield f"http://{host}:{port}", server.engine
    finally:
        server.should_exit = True
        thread.join(timeout=60)


@contextlib.contextmanager
def server_process(*arguments: str, stderr: Any = subprocess.PIPE) -> Iterator[str]:
    """The base url of `python -m exactdraft serve ARGUMENTS --port 0` in its own process, run
    from the repository's root (its stderr: a pipe read if it fails to start, or `stderr`)."""
    command = [sys.executable, "-m", "exactdraft", "serve", *arguments, "--port", "0"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, env=env,
                             text=True, cwd=ROOT)
    try:
        line = child.stdout.readline()  # "exactdraft: serving NAME on http://HOST:PORT"
        assert " on http://" in line, \
            f"the server did not start: {line}{child.stderr and child.stderr.read()}"
        yield line.rsplit(" on ", 1)[1].strip()
    finally:
        child.terminate()
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(timeout=60)
        child.stdout.close()
        if child.stderr is not None:
            child.stderr.close()


def post(base: str, path: str, body: bytes | dict, timeout: float = 120) -> tuple[int, Any]:
    """(status, parsed JSON body) of a POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def get(base: str, path: str) -> Any:
    with urllib.request.urlopen(base + path, timeout=60) as response:
        return json.loads(response.read())
