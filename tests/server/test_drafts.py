"""The server keeps drafts, and its drafted answers are the serial ones: chat requests whose
answers repeat text (temperature 0, where prompt lookup pays), sent together so their passes are
shared, are answered with kept drafts (the receipt's accepted count) and with the tokens, text
and logprobs of the serial Python API run. The negative control: a server of a target whose
multi-row passes are row-count dependent (tests/inexact.py) on a checkpoint whose greedy tokens
flip on ulp changes answers drafted requests with other tokens than drafts-off requests when its
guard is off, and turns drafting off (so both agree) when the guard is on."""

from __future__ import annotations

import concurrent.futures
import warnings

import pytest

import exactdraft as xd
from exactdraft.results import token_digest
from tests.inexact import KNIFE_PROMPTS, InexactTorchBackend
from tests.server.conftest import MODEL
from tests.server.live import post, server_in_thread

MAX_TOKENS = 40
NO_EOS = {2: -1e9}  # the tiny model's eos, banned so every answer runs to its length
X, Y, A = (ord(c) - 29 for c in "xya")  # the tiny tokenizer's ids: printable ASCII from 3
# (messages, extra logit_bias): repeated text the tiny random model picks up on its own, and
# answers held to the prompt's characters by a logit bias, so the prompt's text repeats.
REPEATS = [
    ([{"role": "user", "content": "xyxyxyxyxyxyxyxyxyxyxyxy"}], {}),
    ([{"role": "user", "content": "aaaaaaaaaaaaaaaaaaaaaaaa"}], {}),
    ([{"role": "user", "content": "repeat this: xyxyxyxyxyxy"}], {X: 30.0, Y: 30.0}),
    ([{"role": "user", "content": "repeat this: aaaaaaaaaaaa"}], {A: 30.0}),
]


@pytest.fixture(scope="module")
def served_generator(tiny_checkpoints):
    """The served tiny llama verifying every draft (no timed depth policy): the kept-draft
    counts below are about drafting, not about what a loaded machine's pass timings suggest."""
    return xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch",
                                        drafter=xd.PromptLookup(max_draft=4, min_match=1),
                                        adaptive_depth=False, progress=False)


def chat(base: str, messages: list, bias: dict[int, float]) -> dict:
    body = {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0,
            "logprobs": True, "top_logprobs": 2,
            "logit_bias": {str(t): b for t, b in {**NO_EOS, **bias}.items()}}
    status, reply = post(base, "/v1/chat/completions", body)
    assert status == 200, reply
    return reply["choices"][0]


def test_repeated_text_is_served_with_kept_drafts_and_the_serial_tokens(live, served_generator):
    base, _ = live
    with concurrent.futures.ThreadPoolExecutor(len(REPEATS)) as pool:
        choices = list(pool.map(lambda case: chat(base, *case), REPEATS, timeout=300))
    kept = []
    for (messages, bias), choice in zip(REPEATS, choices):
        alone = served_generator.generate(messages, MAX_TOKENS, temperature=0.0, logprobs=2,
                                          logit_bias={**NO_EOS, **bias}, drafts=False)
        receipt = choice["receipt"]
        assert choice["message"]["content"] == alone.text
        assert receipt["token_ids_sha256"] == token_digest(alone.tokens)
        got = [(e["token_id"], e["logprob"], [(t["token_id"], t["logprob"])
                                              for t in e["top_logprobs"]])
               for e in choice["logprobs"]["content"]]
        assert got == [(e.token, e.logprob, list(e.top)) for e in alone.logprobs]
        assert receipt["drafting"] is True and receipt["drafted"] > 0, receipt
        assert 0 <= receipt["accepted"] <= receipt["drafted"]
        kept.append(receipt["accepted"])
    # The biased answers repeat the prompt's text, so lookup's drafts are kept; whether the
    # tiny random model repeats the unbiased prompts depends on the machine's arithmetic (it
    # kept none on an AMX Xeon), so those answers are held to exactness only.
    assert kept[2] > 0, kept
    assert kept[3] >= MAX_TOKENS // 5, kept  # "a" forty times: the lookup's drafts pay


def knife_server_answers(knife_edge_checkpoint: str, guard: bool) -> list[tuple[dict, dict]]:
    """(drafted receipt, drafts-off receipt) per knife-edge prompt, from a server of the
    knife-edge checkpoint on the inexact backend."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the guard's "drafting is off"
        generator = xd.Generator.from_pretrained(
            knife_edge_checkpoint, InexactTorchBackend(split_k=True),
            drafter=xd.PromptLookup(min_match=1), guard=guard, progress=False)
    assert generator.drafting_enabled is not guard
    pairs = []
    with server_in_thread(generator, "knife", max_sequences=2) as (base, _):
        for prompt in KNIFE_PROMPTS:
            receipts = []
            for drafts in (True, False):
                status, reply = post(base, "/v1/completions", {
                    "model": "knife", "prompt": prompt, "max_tokens": MAX_TOKENS,
                    "temperature": 0, "drafts": drafts})
                assert status == 200, reply
                receipts.append(reply["choices"][0]["receipt"])
            pairs.append(tuple(receipts))
    return pairs


def test_negative_control_a_row_count_dependent_target_served_without_its_guard(
        knife_edge_checkpoint, one_torch_thread):
    pairs = knife_server_answers(knife_edge_checkpoint, guard=False)
    assert all(drafted["drafting"] and drafted["accepted"] > 0 for drafted, _ in pairs), pairs
    assert any(drafted["token_ids_sha256"] != serial["token_ids_sha256"]
               for drafted, serial in pairs), pairs


def test_the_guard_turns_drafting_off_for_a_row_count_dependent_target(knife_edge_checkpoint,
                                                                        one_torch_thread):
    pairs = knife_server_answers(knife_edge_checkpoint, guard=True)
    for drafted, serial in pairs:
        assert drafted["drafting"] is False and drafted["drafted"] == 0, drafted
        assert drafted["token_ids_sha256"] == serial["token_ids_sha256"]


@pytest.mark.parametrize("character", ["x", "y", "a"])
def test_the_tiny_tokenizer_ids_used_above(served_generator, character):
    assert served_generator.tokenizer.encode(character, add_special_tokens=False) == \
        [{"x": X, "y": Y, "a": A}[character]]
