"""Signatures of Anthropic thinking blocks: a signature verifies for its text under its key and
for nothing else (one changed character of the text or the signature, another key); given back
in a request, a signed block is read, a block this server signed and that was changed is
refused naming its message and block, an unsigned one is read, one signed by another key (a
restarted server, another replica) or in another format (Anthropic's API) is read as unsigned,
and a redacted one dropped; through the live server, the whole message's block and the stream's
signature_delta carry the same signature, which the server accepts back and refuses once
changed."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

import exactdraft as xd
from exactdraft.errors import ParameterError
from exactdraft.server.anthropic_api import thinking_apart
from exactdraft.server.fields import RequestError
from exactdraft.server.reasoning.signatures import (
    checked_key_or_random,
    key_id,
    sign,
    verifies,
    was_changed,
)
from exactdraft.server.run import build
from tests.server.live import post
from tests.server.reasoning.test_replies import ASK, KEY, SHAPE, stream, think_server

pytest.importorskip("llguidance")

OTHER = b"o" * 32
THOUGHT = "The user greets; answer in kind."


def changed(text: str) -> str:
    """`text` with its first character replaced by another."""
    return ("x" if text[0] != "x" else "y") + text[1:]


def changed_mac(signature: str) -> str:
    """`signature` with the last character of its mac replaced by another."""
    return signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]


def test_a_signature_verifies_for_its_text_and_key_only():
    signature = sign(KEY, THOUGHT)
    version, named, mac = signature.split(".")
    assert version == "xd1" and named == key_id(KEY) and len(named) == 16
    assert named != key_id(OTHER) and len(base64.b64decode(mac, validate=True)) == 32
    assert verifies(KEY, THOUGHT, signature)
    assert sign(KEY, THOUGHT) == signature  # the same text and key sign alike
    assert not verifies(KEY, changed(THOUGHT), signature)
    assert not verifies(KEY, THOUGHT[:-1], signature)
    assert not verifies(KEY, THOUGHT, changed(signature))
    assert not verifies(KEY, THOUGHT, changed_mac(signature))
    assert not verifies(OTHER, THOUGHT, signature)
    assert not verifies(KEY, THOUGHT, "")
    assert not verifies(KEY, "\ud800", sign(KEY, "\ud801"))  # lone surrogates sign too


def test_only_a_changed_block_this_key_signed_counts_as_changed():
    signature = sign(KEY, THOUGHT)
    assert not was_changed(KEY, THOUGHT, signature)
    assert was_changed(KEY, changed(THOUGHT), signature)
    assert was_changed(KEY, THOUGHT, changed_mac(signature))
    assert was_changed(KEY, THOUGHT, f"xd1.{key_id(KEY)}.not base64")
    # Not this key's: another key id, another version, another API's format.
    for foreign in (sign(OTHER, THOUGHT), sign(OTHER, changed(THOUGHT)),
                    "xd2." + signature[4:], "c2lnbmF0dXJl", signature + ".more", "xd1"):
        assert not was_changed(KEY, changed(THOUGHT), foreign), foreign


def test_the_key():
    first, second = checked_key_or_random(None), checked_key_or_random(None)
    assert len(first) == 32 and first != second  # random for each server
    assert checked_key_or_random(KEY) is KEY
    with pytest.raises(ParameterError, match="thinking_key must be bytes, got str"):
        checked_key_or_random("k" * 32)
    with pytest.raises(ParameterError, match="at least 16 bytes, got 8"):
        checked_key_or_random(b"k" * 8)


def history(block: dict) -> list[dict]:
    return [{"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [block, {"type": "text", "text": "Hello"}]},
            {"role": "user", "content": "Again"}]


def test_blocks_given_back():
    signed = {"type": "thinking", "thinking": THOUGHT, "signature": sign(KEY, THOUGHT)}
    assert thinking_apart(history(signed), KEY)[1]["reasoning_content"] == THOUGHT
    for unsigned in ({"type": "thinking", "thinking": THOUGHT},
                     {"type": "thinking", "thinking": THOUGHT, "signature": ""},
                     {"type": "thinking", "thinking": THOUGHT, "signature": None}):
        assert thinking_apart(history(unsigned), KEY)[1]["reasoning_content"] == THOUGHT
    redacted = thinking_apart(history({"type": "redacted_thinking", "data": "opaque"}), KEY)
    assert redacted[1]["content"] == [{"type": "text", "text": "Hello"}]
    assert "reasoning_content" not in redacted[1]
    # Signed elsewhere (another key: a restart, a replica; Anthropic's API): read as unsigned.
    for foreign in ({**signed, "signature": sign(OTHER, changed(THOUGHT))},
                    {**signed, "signature": "c2lnbmF0dXJl"}):
        assert thinking_apart(history(foreign), KEY)[1]["reasoning_content"] == THOUGHT
    for bad in ({**signed, "thinking": changed(THOUGHT)},
                {**signed, "signature": changed_mac(signed["signature"])},
                {**signed, "signature": sign(KEY, changed(THOUGHT))}):
        with pytest.raises(RequestError, match=r"messages\[1\]\.content\[0\]: invalid "
                                               r"signature") as refused:
            thinking_apart(history(bad), KEY)
        assert refused.value.param == "messages[1].content[0].signature"
        assert refused.value.status == 400
    with pytest.raises(RequestError, match="must be a string"):
        thinking_apart(history({**signed, "signature": 7}), KEY)


def test_a_recorded_session_with_anthropic_signatures_is_read():
    """The recorded agent session's thinking block carries a signature of Anthropic's API
    (not this server's format): read as unsigned under any server key."""
    fixture = Path(__file__).parents[1] / "fixtures" / "agent_session.json"
    requests = json.loads(fixture.read_text())["requests"]
    signed = [r["body"]["messages"] for r in requests if r["path"] == "/v1/messages" and any(
        isinstance(m.get("content"), list) and any(b.get("signature") for b in m["content"]
                                                   if isinstance(b, dict))
        for m in r["body"]["messages"])]
    assert signed, "the fixture has no signed thinking block"
    for messages in signed:
        apart = thinking_apart([m for m in messages if m.get("role") != "system"],
                               checked_key_or_random(None))
        assert any(m.get("reasoning_content") == "Listing the files needs Glob." for m in apart)


def test_a_bad_key_is_refused_before_the_server_starts(tiny_checkpoints):
    generator = xd.Generator.from_pretrained(tiny_checkpoints["llama"], "torch",
                                             progress=False)
    with pytest.raises(ParameterError, match="thinking_key"):
        build(generator, "tiny", port=0, thinking_key=b"short")


@pytest.fixture(scope="module")
def base(tiny_checkpoints):
    with think_server(tiny_checkpoints["llama"]) as (url, _):
        yield url


BODY = {"messages": ASK, "max_tokens": 40, "temperature": 1.0, "seed": 5,
        "constraint": {"regex": SHAPE}}


def test_the_server_signs_and_checks_what_it_signed(base):
    status, message = post(base, "/v1/messages", BODY)
    assert status == 200, message
    block = message["content"][0]
    assert block["type"] == "thinking" and re.fullmatch("[a-z ]{1,12}", block["thinking"])
    assert verifies(KEY, block["thinking"], block["signature"])
    # The stream: a signature_delta with the same signature just before the block stops.
    events = stream(base, "/v1/messages", BODY)
    kinds = [(name, payload.get("delta", {}).get("type")) for name, payload in events
             if payload.get("index") == 0]
    assert kinds[0] == ("content_block_start", None)
    assert kinds[-2:] == [("content_block_delta", "signature_delta"),
                          ("content_block_stop", None)]
    [delta] = [payload["delta"] for name, payload in events
               if payload.get("delta", {}).get("type") == "signature_delta"]
    assert delta["signature"] == block["signature"]

    def given_back(thinking_block: dict) -> tuple[int, dict]:
        answer = {"role": "assistant", "content": [thinking_block, *message["content"][1:]]}
        messages = [*ASK, answer, {"role": "user", "content": "Again"}]
        return post(base, "/v1/messages", {**BODY, "messages": messages, "max_tokens": 4,
                                           "constraint": None})

    status, reply = given_back(block)
    assert status == 200, reply
    status, reply = given_back({**block, "thinking": changed(block["thinking"])})
    assert status == 400, reply
    assert reply["error"]["param"] == "messages[1].content[0].signature"
    assert "messages[1].content[0]: invalid signature" in reply["error"]["message"]
    status, reply = given_back({**block, "signature": changed_mac(block["signature"])})
    assert status == 400 and reply["error"]["param"] == "messages[1].content[0].signature"
    # A restarted server's or another replica's signature (another key), Anthropic's: served.
    for foreign in (sign(OTHER, changed(block["thinking"])), "c2lnbmF0dXJl"):
        status, reply = given_back({**block, "signature": foreign})
        assert status == 200, reply
    status, reply = given_back({"type": "thinking", "thinking": block["thinking"]})
    assert status == 200, reply


def test_the_anthropic_client_gives_the_signed_block_back(base):
    """The anthropic SDK assembles the streamed thinking block, signature_delta included, and
    sends it back unchanged in the next turn: served; the same block with its thinking
    changed: refused, as the SDK's BadRequestError."""
    anthropic = pytest.importorskip("anthropic")
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    extra = {"constraint": {"regex": SHAPE}, "seed": 5}
    with client.messages.stream(model="tiny", max_tokens=40, messages=ASK,
                                extra_body=extra) as events:
        final = events.get_final_message()
    thinking = final.content[0]
    assert thinking.type == "thinking" and verifies(KEY, thinking.thinking, thinking.signature)

    def turn(content: list) -> object:
        return client.messages.create(model="tiny", max_tokens=4, messages=[
            *ASK, {"role": "assistant", "content": content}, {"role": "user", "content": "Ok"}])

    assert turn(final.content).stop_reason in ("end_turn", "max_tokens")
    edited = [{**thinking.model_dump(), "thinking": changed(thinking.thinking)},
              *[block.model_dump() for block in final.content[1:]]]
    with pytest.raises(anthropic.BadRequestError, match=r"messages\[1\]\.content\[0\]"):
        turn(edited)
