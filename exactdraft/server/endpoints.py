"""The server's endpoints, in one table: a new endpoint is its handler in one module (one
module per API family) and one line here.

Invariant: every route the application serves is a row of ENDPOINTS, and each row names the
wire format (`openai` or `anthropic`) its refusals and failures are written in, so a client of
either API always gets an error it can parse.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    # "module:function", the module inside exactdraft.server unless dotted; imported when an
    # application is built
    handler: str
    wire: str = "openai"  # the format of its error bodies: "openai" or "anthropic"
    quiet: bool = False  # logged at DEBUG, not INFO (what probes and scrapers call)

    def load(self) -> Callable[[Any], Awaitable[Any]]:
        module, name = self.handler.split(":")
        if "." not in module:
            module = f"exactdraft.server.{module}"
        return getattr(importlib.import_module(module), name)


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("POST", "/v1/chat/completions", "openai_routes:chat_completions"),
    Endpoint("POST", "/v1/completions", "openai_routes:completions"),
    Endpoint("POST", "/v1/responses", "responses_api:responses"),
    Endpoint("GET", "/v1/models", "openai_routes:models", quiet=True),
    Endpoint("GET", "/tokenizer_info", "tokenizer_api:tokenizer_info", quiet=True),
    Endpoint("POST", "/tokenize", "tokenizer_api:tokenize"),
    Endpoint("POST", "/detokenize", "tokenizer_api:detokenize"),
    Endpoint("POST", "/v1/messages", "anthropic_routes:messages", "anthropic"),
    Endpoint("POST", "/v1/messages/count_tokens", "anthropic_routes:count_tokens", "anthropic"),
    Endpoint("GET", "/health", "operations:health", quiet=True),
    Endpoint("GET", "/metrics", "operations:metrics", quiet=True),
)
