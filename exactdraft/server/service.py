"""Service: what the HTTP routes share: turning a checked request into an engine submission,
and the receipt every response carries.

Invariant: a request reaches the engine only with a prompt that fits the model's context
together with its max_tokens and a constraint checked whole for the model's tokenizer (built
off the event loop), and otherwise is refused: a ContextError in each API's own wording
(fields.py) for a prompt past the context, a RequestError naming the field for anything else;
with `clamp_max_tokens`, a max_tokens past the room the prompt leaves is lowered to that room
instead, and only a prompt that leaves no room is refused.
A receipt names what was computed precisely enough for a client to check it: the sha256 of the
prompt and output token ids, the seed, the drafts made and kept, the backend, the arithmetic
contract and the weights digest. Two processes of the same model under the same arithmetic
answer the same request with the same tokens, text, logprobs and receipt; only `id` and
`created` differ, the receipt's `prefix_cache` (cold, memory or file: where the prompt's
prefix came from) where their caches differ, a thinking block's signature unless they share
a `thinking_key`, and, under the Generator's adaptive depth
(drafts per pass chosen from pass costs timed in each process), the receipt's drafted and
accepted counts and how a stream is cut into chunks (tests/server/test_scale_out.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from exactdraft.engine import Engine, EngineFailed, QueueFull, Submission
from exactdraft.errors import ParameterError, TokenizerError
from exactdraft.prompts import encode_prompt
from exactdraft.results import GenerationResult, receipt
from exactdraft.server.fields import ContextError, RequestError, Wanted
from exactdraft.server.reasoning.signatures import checked_key_or_random

DEFAULT_MAX_TOKENS = 256


def check_aliases(model_name: str, aliases: Mapping[str, str] | None) -> dict[str, str]:
    """The alias map {name a client sends: the served model's name}, each value checked to be
    `model_name` (the one model served) and each name a non-empty string."""
    checked: dict[str, str] = {}
    for alias, served in (aliases or {}).items():
        if not isinstance(alias, str) or not alias:
            raise ParameterError(f"a model alias must be a non-empty string, got {alias!r}")
        if served != model_name:
            raise ParameterError(f"model alias {alias!r} names {served!r}, but this server "
                                 f"serves {model_name!r}")
        checked[alias] = served
    return checked


class Service:
    """`model_aliases`: None (the default) accepts every model name (agents send their own
    model ids) and serves it with the one model; a map {alias: served name} accepts only the
    served name and the aliases and answers any other name 404. Responses always name the
    served model, the one whose weights the receipt names. `clamp_max_tokens`: a max_tokens
    past the room the prompt leaves in the context is lowered to that room (the output may
    then end at the context, finish reason length) instead of refused. `thinking_key`: the
    key Anthropic thinking blocks are signed with (server/reasoning/signatures.py; None: a
    random key for this server, so signatures do not verify on another process)."""

    def __init__(self, engine: Engine, model_name: str,
                 model_aliases: Mapping[str, str] | None = None,
                 clamp_max_tokens: bool = False, thinking_key: bytes | None = None) -> None:
        self.engine = engine
        self.thinking_key = checked_key_or_random(thinking_key)
        self.clamp_max_tokens = clamp_max_tokens
        self.model_name = model_name
        self.aliases = None if model_aliases is None else \
            check_aliases(model_name, model_aliases)
        self.generator = engine.generator
        self.target = engine.target
        self.tokenizer = engine.generator.tokenizer
        self.live: set[Submission] = set()  # submitted and not done, for kv_usage

    def check_model(self, body: dict[str, Any]) -> None:
        name = body.get("model")
        if name is not None and not isinstance(name, str):
            raise RequestError("model must be a string", "model")
        if name is None or self.aliases is None or name == self.model_name or \
                name in self.aliases:
            return
        raise RequestError(f"model {name[:80]!r} is not served here; this server serves "
                           f"{self.model_name!r}", "model", 404, "not_found_error",
                           "model_not_found")

    @property
    def model_names(self) -> list[str]:
        """The names /v1/models lists: the served model's, then its aliases."""
        return [self.model_name, *sorted(set(self.aliases or ()) - {self.model_name})]

    def encode(self, prompt: Any, prompt_field: str) -> list[int]:
        """A prompt's token ids (text, chat messages or ids), whatever its length."""
        if self.tokenizer is None and not isinstance(prompt, list):
            raise RequestError("this model has no tokenizer: send token ids", prompt_field)
        try:
            return encode_prompt(prompt, self.tokenizer, self.target.vocab_size)
        except (TokenizerError, ParameterError) as error:
            raise RequestError(f"{prompt_field}: {error}", prompt_field) from None

    async def submit(self, wanted: Wanted, prompt_field: str) -> tuple[Submission, list[int]]:
        """The request queued in the engine, and its prompt's token ids. Its constraint is
        built, compiled and checked whole first, in a thread (a big schema takes a second;
        the server answers others meanwhile), and refused naming its field."""
        ids = self.encode(wanted.prompt, prompt_field)
        context = self.target.max_context
        room = context - len(ids)
        if room <= 0:
            raise ContextError(len(ids), None, context, prompt_field)
        max_tokens = min(DEFAULT_MAX_TOKENS, room) if wanted.max_tokens is None \
            else wanted.max_tokens
        if max_tokens > room:
            if not self.clamp_max_tokens:
                raise ContextError(len(ids), max_tokens, context, prompt_field)
            max_tokens = room
        vocab = self.target.vocab_size
        for token in wanted.sampling.get("logit_bias", {}):
            if not 0 <= token < vocab:
                raise RequestError(f"logit_bias token id {token} is outside the vocabulary "
                                   f"[0, {vocab})", "logit_bias")
        if wanted.n > self.engine.max_sequences:
            raise RequestError(f"n must be at most {self.engine.max_sequences} here", "n")
        constraint = None  # built last: a request refused above never pays for it
        if wanted.constraint is not None:
            constraint = await asyncio.to_thread(wanted.constraint.build, self.tokenizer)
        try:
            submission = self.engine.submit(ids, n=wanted.n, max_new_tokens=max_tokens,
                                            stop=wanted.stop, logprobs=wanted.logprobs,
                                            drafts=wanted.drafts, constraint=constraint,
                                            **wanted.sampling)
        except QueueFull as error:
            raise RequestError(str(error), None, 429, "rate_limit_error") from None
        except EngineFailed as error:
            raise RequestError(f"the server cannot serve: {error}", None, 503,
                               "api_error") from None
        except (ParameterError, TokenizerError) as error:
            raise RequestError(str(error), None) from None
        self.live = {s for s in self.live if not s.done} | {submission}
        return submission, ids

    def kv_usage(self) -> float:
        """Positions held by the running sequences of this server's requests (a started,
        unfinished sample holds its prompt and output) over the engine's room for them."""
        self.live = {s for s in self.live if not s.done}
        held = sum(len(run.prompt_ids) + len(run.output) for s in list(self.live)
                   for run in s.runs if run.final is None and run.stats.prefill_passes)
        return min(1.0, held / (self.engine.max_sequences * self.target.max_context))

    def receipt(self, result: GenerationResult) -> dict[str, Any]:
        return receipt(self.target, result)

    def piece(self, token: int) -> str:
        """The text of one token, for logprobs."""
        return self.tokenizer.decode([token]) if self.tokenizer is not None else str(token)
