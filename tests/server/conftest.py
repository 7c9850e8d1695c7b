"""A live server of the tiny llama (drafting with prompt lookup) for the module that asks, and
the same model in the test process for the reference runs."""

from __future__ import annotations

import pytest

import exactdraft as xd
from tests.server.live import server_in_thread

pytest.importorskip("starlette", reason="the server extra is not installed")
pytest.importorskip("uvicorn", reason="the server extra is not installed")

MODEL = "tiny-llama"


@pytest.fixture(scope="session")
def served_generator(tiny_checkpoints):
    return xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch",
                                        drafter=xd.PromptLookup(max_draft=4, min_match=1),
                                        progress=False)


@pytest.fixture(scope="module")
def live(served_generator):
    """(base url, engine) of a server of served_generator, for one test module."""
    with server_in_thread(served_generator, MODEL, max_sequences=8, max_waiting=64) as served:
        yield served


@pytest.fixture(scope="module")
def smollm2_server():
    """(base url, generator) of a server of the bundled SmolLM2 drafting with prompt lookup,
    for one test module."""
    generator = xd.Generator.from_pretrained(None, "torch",
                                             drafter=xd.PromptLookup(max_draft=4, min_match=1),
                                             progress=False)
    with server_in_thread(generator, "smollm2", max_sequences=2, max_waiting=8) as (base, _):
        yield base, generator
