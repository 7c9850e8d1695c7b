"""Scaling out: two server processes of the same checkpoint (each its own Python process that
loaded the model itself) answer the same requests, whole and streamed, on every route, with
byte-identical bodies apart from the `id` and `created` fields. With adaptive depth (what
`exactdraft serve` runs), how many drafts a pass verifies follows pass costs timed in each
process, so the receipts' `drafted` and `accepted` counts may differ there; everything else
may not. With adaptive depth off, every byte but `id` and `created` is the same."""

from __future__ import annotations

import contextlib
import json
import re
import urllib.error
import urllib.request

import pytest

from tests.server.live import server_process

USER = [{"role": "user", "content": "abc abc abc"}]
NO_EOS = {"2": -1e9}
REQUESTS = [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 16, "temperature": 0.8,
                              "top_p": 0.95, "seed": 7, "n": 2, "logprobs": True,
                              "top_logprobs": 3, "logit_bias": NO_EOS}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 16, "temperature": 1.0,
                              "top_k": 40, "seed": 3, "stream": True, "logprobs": True,
                              "top_logprobs": 2, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 12, "drafts": False,
                              "temperature": 0, "seed": 1}),
    ("/v1/completions", {"prompt": "hello hello", "max_tokens": 12, "temperature": 0.6,
                         "seed": 2, "logprobs": 2, "logit_bias": NO_EOS}),
    ("/v1/completions", {"prompt": "hello hello", "max_tokens": 12, "temperature": 0.6,
                         "seed": 2, "logprobs": 2, "stream": True}),
    ("/v1/messages", {"messages": USER, "system": "be brief", "max_tokens": 16,
                      "temperature": 0.9, "seed": 11, "stop_sequences": ["zz"]}),
    ("/v1/messages", {"messages": USER, "max_tokens": 16, "temperature": 0.9, "top_k": 30,
                      "seed": 11, "stream": True}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 4, "top_p": 2}),  # refused
]
# The only fields allowed to differ: a response's (or chunk's) id and creation time.
VARYING = re.compile(rb'"(id)": ?"[^"]*"|"(created)": ?\d+')
# And, under adaptive depth, the speed statistics of a receipt.
TIMED = re.compile(rb'"(drafted)": ?\d+|"(accepted)": ?\d+')


def body_of(base: str, path: str, payload: dict | None) -> tuple[int, bytes]:
    """(status, raw body) of a GET (payload None) or POST."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(base + path, data=data,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def normalized(raw: bytes, pattern: re.Pattern[bytes] = VARYING) -> bytes:
    """`raw` with every match of `pattern` set to null."""
    return pattern.sub(lambda match: b'"%s": null' % (match.group(1) or match.group(2)), raw)


@pytest.mark.parametrize("flags, blanked", [((), TIMED), (("--no-adaptive-depth",), None)])
def test_two_processes_answer_byte_identically(tiny_checkpoints, flags: tuple[str, ...],
                                               blanked: re.Pattern[bytes] | None) -> None:
    """Each request, sent to both processes in the same order, gets the same status and the
    same body bytes once ids and creation times (and `blanked`) are set to null; each
    generation really carries a receipt and ids (so blanking hid something), and the refusal
    is a 400."""
    folder = tiny_checkpoints["llama"]
    with contextlib.ExitStack() as stack:
        bases = [stack.enter_context(server_process(folder, "--backend", "torch", *flags))
                 for _ in range(2)]
        assert bases[0] != bases[1]
        for path, payload in [*REQUESTS, ("/v1/models", None), ("/health", None)]:
            (status, first), (again, second) = (body_of(base, path, payload)
                                                for base in bases)
            refused = payload is not None and payload.get("top_p", 0) > 1
            assert status == again == (400 if refused else 200), first
            if blanked is not None:
                first, second = normalized(first, blanked), normalized(second, blanked)
            assert normalized(first) == normalized(second), (path, payload)
            if payload is not None and not refused:
                assert b'"receipt"' in first and VARYING.search(first), first[:300]
                assert first != second  # the ids differ: the processes are distinct
