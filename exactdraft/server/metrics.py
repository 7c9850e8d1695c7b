"""Prometheus metrics of one application, named as vLLM names them so routers that scrape vLLM
replicas (Ray Serve, Kubernetes gateways) read exactdraft's the same way.

Invariant: each application has its own registry (several apps in one process never share or
clash), and the counters move exactly by what the responses report: `vllm:prompt_tokens_total`
by each request's `usage` prompt tokens, `vllm:generation_tokens_total` by its completion
tokens, `exactdraft:drafted_tokens_total` and `exactdraft:accepted_tokens_total` by the
drafted and accepted counts of its receipts. Gauges are read when scraped: running sequences
and waiting requests from the engine, and `vllm:kv_cache_usage_perc` as the positions held by
the server's running sequences over the engine's room for them (max_sequences times the
model's context), from 0 to 1; `exactdraft:engine_healthy` is 1 while the engine serves and
0 once it has stopped after a failure (the server then exits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# vLLM's buckets for the time to first token, so dashboards built for it read these too.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The metrics of one application; `text()` is the /metrics body."""

    def __init__(self, model_name: str, load: Callable[[], tuple[int, int]],
                 kv_usage: Callable[[], float], healthy: Callable[[], bool]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        labels = ["model_name"]

        def gauge(name: str, text: str, read: Callable[[], float]) -> None:
            Gauge(name, text, labels, registry=self.registry).labels(model_name) \
                .set_function(read)

        def counter(name: str, text: str) -> Any:
            return Counter(name, text, labels, registry=self.registry).labels(model_name)

        gauge("vllm:num_requests_running", "Sequences in the engine's passes.",
              lambda: load()[0])
        gauge("vllm:num_requests_waiting", "Requests queued for the engine.", lambda: load()[1])
        gauge("vllm:kv_cache_usage_perc", "Fraction of the engine's KV positions held by "
              "running sequences (1 = all).", kv_usage)
        gauge("exactdraft:engine_healthy", "1 while the engine serves, 0 once it stopped after "
              "a failure (a dead tensor-parallel rank, a pass that raised).",
              lambda: float(healthy()))
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of the requests "
                                     "answered.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.prefix_cache_queries = counter("vllm:prefix_cache_queries",
                                            "Prompt tokens looked up in the prefix cache.")
        self.prefix_cache_hits = counter("vllm:prefix_cache_hits",
                                         "Prompt tokens taken from the prefix cache.")
        self.drafted = counter("exactdraft:drafted_tokens", "Draft tokens verified.")
        self.accepted = counter("exactdraft:accepted_tokens", "Draft tokens kept.")
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds", "Seconds from a request's arrival to its "
            "first token.", labels, buckets=TTFT_BUCKETS,
            registry=self.registry).labels(model_name)

    def count(self, prompt: int, completion: int, cached: int, drafted: int, accepted: int,
              first_token_seconds: float | None) -> None:
        self.prompt_tokens.inc(prompt)
        self.generation_tokens.inc(completion)
        self.prefix_cache_queries.inc(prompt)
        self.prefix_cache_hits.inc(cached)
        self.drafted.inc(drafted)
        self.accepted.inc(accepted)
        if first_token_seconds is not None:
            self.time_to_first_token.observe(first_token_seconds)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("prometheus_client") is not None
