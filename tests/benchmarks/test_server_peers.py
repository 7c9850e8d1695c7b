"""benchmarks/server_peers.py: the side-by-side measurement against exactdraft's own server on a
tiny checkpoint (no timing is asserted), its reply comparison with a server that answers
differently as the negative control, and a llama.cpp server that cannot start."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import exactdraft as xd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import server_peers  # noqa: E402

pytest.importorskip("starlette", reason="the server extra is not installed")
pytest.importorskip("uvicorn", reason="the server extra is not installed")


def bodies(count: int, tokens: int) -> list[dict]:
    return [{"model": "bench", "messages": [{"role": "user", "content": f"Count to {i + 3}."}],
             "max_tokens": tokens, "temperature": 0.7, "seed": 40 + i} for i in range(count)]


def test_side_against_exactdraft_server(tiny_checkpoints):
    generator = xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch", progress=False)
    with server_peers.exactdraft_server(generator, 3) as base:
        figures = server_peers.side(base, bodies(3, 6))
    assert figures["identical"] == [True, True, True] and figures["all_identical"]
    assert 3 <= figures["completion_tokens"] <= 18
    assert figures["solo_tokens_per_second"] > 0 and figures["concurrent_tokens_per_second"] > 0
    assert figures["ratio"] > 0


def test_side_reports_a_reply_that_differs(monkeypatch):
    calls: dict[int, int] = {}

    def answer(base: str, body: dict) -> dict:  # seed 41 answers differently the second time
        calls[body["seed"]] = calls.get(body["seed"], 0) + 1
        text = f"{body['seed']}-{calls[body['seed']]}" if body["seed"] == 41 else "same"
        return {"choices": [{"message": {"content": text}}],
                "usage": {"completion_tokens": body["max_tokens"]}}

    monkeypatch.setattr(server_peers, "post", answer)
    figures = server_peers.side("http://unused", bodies(3, 5))
    assert figures["identical"] == [True, False, True] and not figures["all_identical"]
    assert figures["completion_tokens"] == 15


def test_llama_server_that_cannot_start_raises():
    if importlib.util.find_spec("llama_cpp") is not None:
        pytest.skip("llama-cpp-python is installed here, so its server would start")
    with pytest.raises(RuntimeError, match="llama.cpp's server exited"):
        with server_peers.llama_server(sys.executable, "/nonexistent.gguf", 1, 256):
            pass
