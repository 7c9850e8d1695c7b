"""/metrics: Prometheus text that prometheus_client's own parser reads, with the names routers
scrape from vLLM; its counters move by exactly the token counts the responses report, and two
applications in one process keep separate registries."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.server.conftest import MODEL
from tests.server.live import post, server_in_thread

parser = pytest.importorskip("prometheus_client.parser")

USER = [{"role": "user", "content": "abc abc abc"}]
NO_EOS = {"2": -1e9}
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
            "exactdraft:drafted_tokens_total", "exactdraft:accepted_tokens_total",
            "vllm:time_to_first_token_seconds_count")
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def scrape(base: str) -> dict[str, float]:
    """Every sample of /metrics by name (each carries model_name=MODEL)."""
    with urllib.request.urlopen(base + "/metrics", timeout=60) as response:
        assert response.headers["content-type"].startswith("text/plain")
        text = response.read().decode()
    samples = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_bucket") or sample.name.endswith("_created"):
                continue
            assert sample.labels == {"model_name": MODEL}, sample
            samples[sample.name] = sample.value
    return samples


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in COUNTERS}


def test_metrics_names_and_gauges(live) -> None:
    base, _ = live
    samples = scrape(base)
    for name in COUNTERS + GAUGES:
        assert name in samples, name
    assert samples["vllm:num_requests_running"] == samples["vllm:num_requests_waiting"] == 0
    assert 0 <= samples["vllm:kv_cache_usage_perc"] <= 1


def test_counters_move_by_the_usage_of_each_request(live) -> None:
    """A chat completion with n=2, a streamed message and a refused request: the counters
    move by the prompt and completion tokens each response reports and by the drafted and
    accepted counts of its receipts, and the refusal moves nothing."""
    base, _ = live
    before = scrape(base)
    status, reply = post(base, "/v1/chat/completions", {
        "model": MODEL, "messages": USER, "max_tokens": 20, "n": 2, "temperature": 0.8,
        "seed": 4, "logit_bias": NO_EOS})
    assert status == 200 and reply["usage"]["completion_tokens"] == 40
    receipts = [choice["receipt"] for choice in reply["choices"]]
    assert moved(before, scrape(base)) == {
        "vllm:prompt_tokens_total": reply["usage"]["prompt_tokens"],
        "vllm:generation_tokens_total": reply["usage"]["completion_tokens"],
        "exactdraft:drafted_tokens_total": sum(r["drafted"] for r in receipts),
        "exactdraft:accepted_tokens_total": sum(r["accepted"] for r in receipts),
        "vllm:time_to_first_token_seconds_count": 1}
    assert sum(r["drafted"] for r in receipts) > 0  # drafting ran, so the check has teeth

    before = scrape(base)
    events = streamed(base, {"model": MODEL, "messages": USER, "max_tokens": 12,
                             "stream": True, "temperature": 0, "system": "be brief"})
    start = next(e for e in events if e["type"] == "message_start")["message"]["usage"]
    delta = next(e for e in events if e["type"] == "message_delta")
    assert moved(before, scrape(base)) == {
        "vllm:prompt_tokens_total": start["input_tokens"] +
        start.get("cache_read_input_tokens", 0),
        "vllm:generation_tokens_total": delta["usage"]["output_tokens"],
        "exactdraft:drafted_tokens_total": delta["receipt"]["drafted"],
        "exactdraft:accepted_tokens_total": delta["receipt"]["accepted"],
        "vllm:time_to_first_token_seconds_count": 1}

    before = scrape(base)
    assert post(base, "/v1/chat/completions", {"model": MODEL, "messages": USER,
                                               "top_p": 2})[0] == 400
    assert set(moved(before, scrape(base)).values()) == {0}


def streamed(base: str, body: dict) -> list[dict]:
    request = urllib.request.Request(base + "/v1/messages", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return [json.loads(line[6:]) for line in response if line.startswith(b"data: ")]


def test_two_applications_in_one_process_count_apart(served_generator, live) -> None:
    """A second server in this process starts (a shared registry would refuse its metric
    names) and its counters start at zero whatever the first one counted."""
    base, _ = live
    assert post(base, "/v1/completions", {"model": MODEL, "prompt": "abc", "max_tokens": 3})[0] \
        == 200
    assert scrape(base)["vllm:generation_tokens_total"] > 0
    with server_in_thread(served_generator, MODEL) as (other, _):
        assert scrape(other)["vllm:generation_tokens_total"] == 0
        # </s> barred: a sample may otherwise end before max_tokens and count fewer than 3.
        assert post(other, "/v1/completions", {"model": MODEL, "prompt": "abc",
                                               "max_tokens": 3, "logit_bias": NO_EOS})[0] == 200
        assert scrape(other)["vllm:generation_tokens_total"] == 3


def test_without_prometheus_client_metrics_says_what_to_install(served_generator,
                                                                monkeypatch) -> None:
    """Without prometheus_client the server still serves, and /metrics answers 501 naming the
    package."""
    import urllib.error

    import exactdraft.server.app as app_module

    monkeypatch.setattr(app_module, "metrics_available", lambda: False)
    with server_in_thread(served_generator, MODEL) as (base, _):
        assert post(base, "/v1/completions", {"prompt": "abc", "max_tokens": 2})[0] == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/metrics", timeout=60)
        assert refused.value.code == 501
        assert "prometheus_client" in json.loads(refused.value.read())["error"]["message"]
