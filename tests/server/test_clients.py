"""The official openai and anthropic clients against a live server: chat, completion and
messages calls, streaming and not, logprobs, stop strings and n. Every answer is the Python
API's serial answer to the same request (text, logprobs to the last bit, the receipt's token
digest and seed), and a request with drafts off gets the same receipt digest as with drafts."""

from __future__ import annotations

import pytest

from exactdraft.engine import sample_seed
from exactdraft.results import token_digest
from tests.server.conftest import MODEL

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "abc abc abc"}]
NO_EOS = {"2": -1e9}  # the tiny model's eos, banned where a run must reach its length


@pytest.fixture(scope="module")
def clients(live):
    base, _ = live
    return (openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0),
            anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0))


def serial(generator, prompt, **options):
    return generator.generate(prompt, drafts=False, **options)


def without_speed(receipt: dict) -> dict:
    """A receipt less its draft counts: how many drafts a run verifies follows the pass costs
    the Generator measures as it runs, so two runs of one request may differ there, and only
    there (the counts must still be consistent)."""
    assert 0 <= receipt["accepted"] <= receipt["drafted"]
    return {k: v for k, v in receipt.items() if k not in ("drafted", "accepted")}


def test_chat_with_n_and_logprobs_equals_the_serial_python_api(clients, served_generator):
    client, _ = clients
    reply = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=24, temperature=0.8, top_p=0.95, seed=7, n=2,
        logprobs=True, top_logprobs=3, logit_bias=NO_EOS)
    assert len(reply.choices) == 2
    for index, choice in enumerate(reply.choices):
        alone = serial(served_generator, CHAT, max_new_tokens=24, temperature=0.8, top_p=0.95,
                       seed=sample_seed(7, index), logprobs=3, logit_bias={2: -1e9})
        receipt = choice.model_extra["receipt"]
        assert choice.message.content == alone.text and choice.finish_reason == "length"
        assert receipt["token_ids_sha256"] == token_digest(alone.tokens)
        assert receipt["seed"] == alone.seed and receipt["drafting"] is True
        got = [(e.token_id, e.logprob, [(t.token_id, t.logprob) for t in e.top_logprobs])
               for e in choice.logprobs.content]
        assert got == [(e.token, e.logprob, list(e.top)) for e in alone.logprobs]
    serial_reply = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=24, temperature=0.8, top_p=0.95, seed=7,
        logit_bias=NO_EOS, extra_body={"drafts": False})
    receipt = serial_reply.choices[0].model_extra["receipt"]
    assert receipt["drafting"] is False and receipt["drafted"] == 0
    assert receipt["token_ids_sha256"] == \
        reply.choices[0].model_extra["receipt"]["token_ids_sha256"]


def test_a_streamed_chat_equals_the_whole_one(clients):
    client, _ = clients
    options = dict(model=MODEL, messages=CHAT, max_tokens=30, temperature=1.0, seed=3,
                   logprobs=True, top_logprobs=1, extra_body={"top_k": 40, "min_p": 0.02})
    whole = client.chat.completions.create(**options)
    chunks = list(client.chat.completions.create(stream=True, **options))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    logprobs = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert text == whole.choices[0].message.content
    assert logprobs == [e.logprob for e in whole.choices[0].logprobs.content]
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert without_speed(chunks[-1].choices[0].model_extra["receipt"]) == \
        without_speed(whole.choices[0].model_extra["receipt"])


def test_a_stop_string_ends_chat_completion_and_message_where_serial_ends(clients,
                                                                          served_generator):
    client, claude = clients
    full = serial(served_generator, CHAT, max_new_tokens=30, temperature=0.7, seed=5,
                  logit_bias={2: -1e9})
    stop = full.text[8:10]
    alone = serial(served_generator, CHAT, max_new_tokens=30, temperature=0.7, seed=5,
                   logit_bias={2: -1e9}, stop=[stop])
    assert alone.finish_reason == "stop" and alone.stop == stop
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=30,
                                          temperature=0.7, seed=5, stop=[stop],
                                          logit_bias=NO_EOS)
    assert chat.choices[0].message.content == alone.text
    assert chat.choices[0].finish_reason == "stop"
    extra = {"temperature": 0.7, "seed": 5}
    message = claude.messages.create(model=MODEL, max_tokens=30, system="be brief",
                                     messages=CHAT[1:], stop_sequences=[stop],
                                     extra_body=extra)
    assert message.content[0].text == alone.text
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", stop)
    with claude.messages.stream(model=MODEL, max_tokens=30, system="be brief",
                                messages=CHAT[1:], stop_sequences=[stop],
                                extra_body=extra) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == alone.text and final.stop_reason == "stop_sequence"
    events = list(claude.messages.create(model=MODEL, max_tokens=30, system="be brief",
                                         messages=CHAT[1:], stop_sequences=[stop],
                                         extra_body=extra, stream=True))
    delta = next(e for e in events if e.type == "message_delta")
    assert without_speed(delta.model_extra["receipt"]) == \
        without_speed(message.model_extra["receipt"])
    assert [e.type for e in events][-1] == "message_stop"


def test_messages_equal_the_serial_python_api(clients, served_generator):
    _, claude = clients
    message = claude.messages.create(model=MODEL, max_tokens=20, messages=CHAT[1:],
                                     extra_body={"temperature": 0.9, "top_k": 30, "seed": 11})
    alone = serial(served_generator, CHAT[1:], max_new_tokens=20, temperature=0.9, top_k=30,
                   seed=11)
    assert message.content[0].text == alone.text
    assert message.model_extra["receipt"]["token_ids_sha256"] == token_digest(alone.tokens)
    assert message.usage.output_tokens == len(alone.tokens)
    assert message.stop_reason == ("max_tokens" if alone.finish_reason == "length"
                                   else "end_turn")


def test_completions_whole_and_streamed_with_logprobs(clients, served_generator):
    client, _ = clients
    options = dict(model=MODEL, prompt="hello hello", max_tokens=12, temperature=0.6, seed=2,
                   logprobs=2, logit_bias=NO_EOS)
    whole = client.completions.create(**options)
    alone = serial(served_generator, "hello hello", max_new_tokens=12, temperature=0.6, seed=2,
                   logprobs=2, logit_bias={2: -1e9})
    choice = whole.choices[0]
    assert choice.text == alone.text and choice.finish_reason == "length"
    assert choice.logprobs.token_logprobs == [e.logprob for e in alone.logprobs]
    assert [list(t.values()) for t in choice.logprobs.top_logprobs] == \
        [[lp for _, lp in e.top] for e in alone.logprobs]
    streamed = "".join(c.choices[0].text for c in
                       client.completions.create(stream=True, **options))
    assert streamed == choice.text
    assert whole.usage.completion_tokens == 12


def test_models_lists_the_served_model(clients):
    client, _ = clients
    assert [m.id for m in client.models.list()] == [MODEL]
