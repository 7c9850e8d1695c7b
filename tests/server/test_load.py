"""A bounded load test: 32 streamed requests from 16 concurrent clients, with mixed sampling
(greedy, temperature 0.7 and 1.0, top_p, top_k, seeds given or not, n=2, drafts on and off,
chat completions and messages). Every choice equals the same request run alone and serially
through the Python API: its text, and its receipt's token digest and seed."""

from __future__ import annotations

import concurrent.futures
import json
import urllib.request
from typing import Any

from exactdraft.engine import sample_seed
from exactdraft.results import token_digest
from tests.server.conftest import MODEL

REQUESTS = 32
CLIENTS = 16


def request_of(i: int) -> tuple[str, dict[str, Any]]:
    """(path, body) of request i: its parameters cycle with different periods."""
    body: dict[str, Any] = {
        "model": MODEL, "stream": True, "max_tokens": 12 + i % 5,
        "messages": [{"role": "user", "content": f"abc {i % 7} abc {i % 3}"}],
        "temperature": (0, 0.7, 1.0)[i % 3]}
    if i % 4 == 1:
        body["top_p"] = 0.9
    if i % 5 == 2:
        body["top_k"] = 20
    if i % 8 != 7:  # otherwise the server draws the seed, and reports it in the receipt
        body["seed"] = 100 + i
    if i % 4 == 3:
        body["drafts"] = False
    if i % 3 == 2:
        return "/v1/messages", body
    if i % 6 == 1:
        body["n"] = 2
    return "/v1/chat/completions", body


def streamed(base: str, path: str, body: dict[str, Any]) -> dict[int, tuple[str, Any]]:
    """choice index -> (text, receipt) of one streamed request, read from its SSE lines."""
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                     method="POST", headers={"content-type": "application/json"})
    texts: dict[int, str] = {}
    receipts: dict[int, Any] = {}
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[len(b"data: "):])
            assert "error" not in event, event
            if event.get("type") == "content_block_delta":
                texts[0] = texts.get(0, "") + event["delta"]["text"]
            elif event.get("type") == "message_delta":
                receipts[0] = event["receipt"]
            for choice in event.get("choices", []):
                index = choice["index"]
                texts[index] = texts.get(index, "") + (choice["delta"].get("content") or "")
                if choice.get("receipt"):
                    receipts[index] = choice["receipt"]
    return {index: (texts.get(index, ""), receipt) for index, receipt in receipts.items()}


def test_concurrent_mixed_streams_equal_serial_runs_alone(live, served_generator) -> None:
    """Every choice of 32 concurrent streams equals its serial Python API run (drafts off)
    with its seed: sample_seed(seed, j) for choice j, or the drawn seed the receipt reports."""
    base, _ = live
    requests = [request_of(i) for i in range(REQUESTS)]
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        replies = list(pool.map(lambda r: streamed(base, *r), requests, timeout=300))
    for (path, body), reply in zip(requests, replies):
        assert sorted(reply) == list(range(body.get("n", 1))), (body, reply)
        sampling = {name: body[name] for name in ("temperature", "top_p", "top_k")
                    if name in body}
        for index, (text, receipt) in reply.items():
            if "seed" in body:
                assert receipt["seed"] == sample_seed(body["seed"], index)
            assert receipt["drafting"] is body.get("drafts", True)
            alone = served_generator.generate(body["messages"], drafts=False,
                                              max_new_tokens=body["max_tokens"],
                                              seed=receipt["seed"], **sampling)
            assert text == alone.text, (path, body, index)
            assert receipt["token_ids_sha256"] == token_digest(alone.tokens)
            assert receipt["completion_tokens"] == len(alone.tokens)
