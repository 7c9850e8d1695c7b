"""examples/ray_serve_app.py on a local Ray instance: two replicas, each its own process that
loaded the model itself, answer the same requests (whole and streamed, on every API) with
bodies identical apart from `id` and `created` (adaptive depth off, so the receipts' draft
counts match too). Slow job only: Ray starts actors for its controller, proxy and replicas."""

from __future__ import annotations

import json
import os
import socket
import urllib.request

import pytest

from tests.server.test_scale_out import VARYING, normalized

pytestmark = pytest.mark.slow
serve = pytest.importorskip("ray.serve", reason="ray[serve] is not installed")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER = [{"role": "user", "content": "abc abc abc"}]
REQUESTS = [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 16, "temperature": 0.8,
                              "seed": 7, "n": 2, "logprobs": True, "top_logprobs": 2}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 12, "temperature": 1.0,
                              "seed": 3, "stream": True}),
    ("/v1/completions", {"prompt": [[5, 9, 17, 3], "hello"], "max_tokens": 4, "echo": True,
                         "logprobs": 1, "temperature": 0, "seed": 1}),
    ("/v1/messages", {"messages": USER, "max_tokens": 12, "temperature": 0.9, "seed": 11,
                      "stream": True}),
    ("/v1/responses", {"input": "abc abc", "max_output_tokens": 10, "temperature": 0.7,
                       "seed": 2}),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answer(base: str, path: str, payload: dict) -> tuple[str, bytes]:
    """(the replica that answered, the raw body) of a POST."""
    request = urllib.request.Request(base + path, data=json.dumps(payload).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200
        return response.headers["x-exactdraft-replica"], response.read()


def test_two_replicas_answer_byte_identically(tiny_checkpoints) -> None:
    import ray

    from examples.ray_serve_app import build

    env = {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
           "HF_HUB_OFFLINE": "1"}
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env},
             log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build({"model": tiny_checkpoints["llama"], "backend": "torch",
                         "replicas": "2", "cpus": "1", "adaptive_depth": "false",
                         "model_name": "tiny"}), route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        replicas_seen = set()
        for path, payload in REQUESTS:
            bodies: dict[str, bytes] = {}
            for _ in range(40):  # the proxy picks a replica per request
                replica, body = answer(base, path, {"model": "tiny", **payload})
                bodies.setdefault(replica, body)
                if len(bodies) == 2:
                    break
            assert len(bodies) == 2, f"one replica answered every {path} request"
            first, second = bodies.values()
            assert b'"receipt"' in first and VARYING.search(first)
            a, b = normalized(first), normalized(second)
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            assert a == b, (path, a[at - 300:at + 60], b[at - 300:at + 60])
            assert first != second  # distinct ids: distinct answers
            replicas_seen |= set(bodies)
        assert len(replicas_seen) == 2
    finally:
        serve.shutdown()
        ray.shutdown()
