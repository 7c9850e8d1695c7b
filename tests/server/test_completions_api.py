"""/v1/completions for scoring: the requests lm-evaluation-harness's `local-completions`
sends for loglikelihood tasks (`prompt: [[ids], ...]`, `echo`, `logprobs: 1`, `max_tokens` 1
or 0), answered with prompt-token logprobs equal, bit for bit, to exactdraft.scoring's and to
the logprobs those tokens get when decoded; lists of prompts (one choice per prompt and
sample, `index` in order), streamed or not."""

from __future__ import annotations

import json
import urllib.request

import pytest

from exactdraft.engine import sample_seed
from exactdraft.scoring import score
from tests.server.conftest import MODEL
from tests.server.live import post

PAIRS = [("The capital of France is", " Paris"), ("2 + 2 =", " 4 and more"),
         ("a b c d e f g h i j k l m n o p q r s t u v w x y z", " a b c")]


def harness_request(prompts: list[list[int]], max_tokens: int) -> dict:
    """What lm-evaluation-harness's local-completions sends to score continuations."""
    return {"model": MODEL, "prompt": prompts, "temperature": 0, "max_tokens": max_tokens,
            "logprobs": 1, "seed": 1234, "echo": True}


def loglikelihood(choice: dict, context_length: int) -> tuple[float, bool]:
    """(sum of the continuation's logprobs, whether each was the top choice), read from the
    slice [context_length:-1] of a choice generated one token past the prompt."""
    logprobs = choice["logprobs"]["token_logprobs"][context_length:-1]
    tops = choice["logprobs"]["top_logprobs"][context_length:-1]
    return sum(logprobs), all(lp == max(top.values()) for lp, top in zip(logprobs, tops))


@pytest.mark.parametrize("max_tokens", [1, 0])
def test_harness_requests_get_exact_prompt_logprobs(live, served_generator,
                                                    max_tokens: int) -> None:
    base, _ = live
    tokenizer = served_generator.tokenizer
    contexts = [tokenizer.encode(c) for c, _ in PAIRS]
    continuations = [tokenizer.encode(c, add_special_tokens=False) for _, c in PAIRS]
    prompts = [c + d for c, d in zip(contexts, continuations)]
    status, reply = post(base, "/v1/completions", harness_request(prompts, max_tokens))
    assert status == 200, reply
    choices = sorted(reply["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2]
    for choice, prompt, context, continuation in zip(choices, prompts, contexts,
                                                     continuations):
        logprobs = choice["logprobs"]
        assert len(logprobs["token_logprobs"]) == len(prompt) + max_tokens
        assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
        assert logprobs["tokens"][:len(prompt)] == [tokenizer.decode([t]) for t in prompt]
        assert choice["text"].startswith(tokenizer.decode(prompt))
        expected = score(served_generator, context, continuation, temperature=0, top=1)
        got = logprobs["token_logprobs"][len(context):len(prompt)]
        assert [float(v).hex() for v in got] == [e.logprob.hex() for e in expected]
        tops = logprobs["top_logprobs"][len(context):len(prompt)]
        assert [list(t.values()) for t in tops] == [[lp for _, lp in e.top] for e in expected]
        if max_tokens == 1:
            total, greedy = loglikelihood(choice, len(context))
            assert total == sum(e.logprob for e in expected)
            assert greedy == all(e.top[0][0] == e.token for e in expected)
            alone = served_generator.generate(prompt, max_new_tokens=1, temperature=0,
                                              logprobs=1, drafts=False)
            assert logprobs["token_logprobs"][-1] == alone.logprobs[0].logprob
        else:
            assert choice["text"] == tokenizer.decode(prompt)
            assert choice["finish_reason"] == "length"
    assert reply["usage"]["prompt_tokens"] == sum(map(len, prompts))
    assert reply["usage"]["completion_tokens"] == len(prompts) * max_tokens


def test_echoed_logprobs_equal_the_decoded_ones(live, served_generator) -> None:
    """Generate with logprobs, then echo prompt + output at max_tokens 0: the output's part
    of the echoed logprobs is the decoded logprobs, bit for bit (sampling settings the same,
    filters included); the official client reads it."""
    openai = pytest.importorskip("openai")
    base, _ = live
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    prompt = served_generator.tokenizer.encode("hello hello")
    settings = dict(temperature=0.8, top_p=0.95, top_k=40)
    decoded = served_generator.generate(prompt, max_new_tokens=16, logprobs=2, seed=6,
                                        drafts=False, **settings)
    reply = client.completions.create(model=MODEL, prompt=[prompt + decoded.tokens], echo=True,
                                      logprobs=2, max_tokens=0, extra_body=dict(settings))
    logprobs = reply.choices[0].logprobs
    assert logprobs.token_logprobs[len(prompt):] == [e.logprob for e in decoded.logprobs]
    assert [list(t.values()) for t in logprobs.top_logprobs[len(prompt):]] == \
        [[lp for _, lp in e.top] for e in decoded.logprobs]
    shifted = client.completions.create(model=MODEL, prompt=[prompt + decoded.tokens[1:]],
                                        echo=True, logprobs=2, max_tokens=0,
                                        extra_body=dict(settings))
    assert shifted.choices[0].logprobs.token_logprobs[len(prompt):] != \
        logprobs.token_logprobs[len(prompt) + 1:]  # a control: other prefixes, other values


def stream_choices(base: str, body: dict) -> dict[int, tuple[str, list]]:
    request = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    found: dict[int, tuple[str, list]] = {}
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response:
            if not line.startswith(b"data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                text, logprobs = found.get(choice["index"], ("", []))
                extra = (choice.get("logprobs") or {}).get("token_logprobs", [])
                found[choice["index"]] = (text + choice["text"], logprobs + extra)
    return found


@pytest.mark.parametrize("echo", [False, True])
def test_a_list_of_prompts_with_n(live, served_generator, echo: bool) -> None:
    """Two text prompts, n=2: choice p * 2 + j is prompt p's sample j, equal to its serial run
    with seed sample_seed(seed, j); streamed, each index concatenates to the whole choice."""
    base, _ = live
    prompts = ["abc abc", "hello there"]
    body = {"model": MODEL, "prompt": prompts, "n": 2, "max_tokens": 10, "temperature": 0.9,
            "seed": 21, "logprobs": 1, "echo": echo, "logit_bias": {"2": -1e9}}
    status, reply = post(base, "/v1/completions", body)
    assert status == 200, reply
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]
    for choice in reply["choices"]:
        p, j = divmod(choice["index"], 2)
        alone = served_generator.generate(prompts[p], max_new_tokens=10, temperature=0.9,
                                          seed=sample_seed(21, j), logit_bias={2: -1e9},
                                          drafts=False)
        assert choice["text"] == (prompts[p] if echo else "") + alone.text
    assert reply["usage"]["completion_tokens"] == 40
    streamed = stream_choices(base, {**body, "stream": True})
    assert sorted(streamed) == [0, 1, 2, 3]
    for choice in reply["choices"]:
        text, logprobs = streamed[choice["index"]]
        assert text == choice["text"]
        assert logprobs == choice["logprobs"]["token_logprobs"]
