"""vLLM's tokenizer endpoints: GET /tokenizer_info, POST /tokenize and POST /detokenize, which
lm-evaluation-harness's `local-completions` (its remote tokenizer) and other vLLM clients call
instead of loading the model's tokenizer themselves.

Invariant: they answer with the served checkpoint's own tokenizer, the one every generating
endpoint encodes with: /tokenize of chat `messages` gives the ids /v1/chat/completions prompts
the model with (same template, same rendering), /tokenize of a `prompt` with
`add_special_tokens` the ids /v1/completions uses for that text, and /detokenize of any ids in
the vocabulary gives the text those ids decode to, special tokens included, so tokenize then
detokenize gives the text back. They read the tokenizer and change nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exactdraft.errors import TokenizerError
from exactdraft.server.context import Call
from exactdraft.server.fields import (
    RequestError,
    chat_messages,
    checked_text,
    refuse_unsupported,
    typed,
)
from exactdraft.server.service import Service

# vLLM's chat tokenize request options this server has no counterpart for.
UNSUPPORTED = ("tools", "chat_template", "chat_template_kwargs", "continue_final_message",
               "mm_processor_kwargs")


async def tokenizer_info(call: Call) -> Any:
    """The tokenizer's configuration, as vLLM gives it (the fields of tokenizer_config.json
    that the served tokenizer knows)."""
    from starlette.responses import JSONResponse

    return JSONResponse(info(call.service))


async def tokenize(call: Call) -> Any:
    from starlette.responses import JSONResponse

    service = call.service
    return JSONResponse(tokenized(await call.body(), service))


async def detokenize(call: Call) -> Any:
    from starlette.responses import JSONResponse

    service = call.service
    return JSONResponse({"prompt": detokenized(await call.body(), service)})


def _tokenizer(service: Service) -> Any:
    if service.tokenizer is None:
        raise RequestError("this model has no tokenizer", None)
    return service.tokenizer


def info(service: Service) -> dict[str, Any]:
    tokenizer = _tokenizer(service)
    fields: dict[str, Any] = {
        "tokenizer_class": type(tokenizer).__name__, "model": service.model_name,
        "bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token,
        "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        "add_bos_token": tokenizer.add_bos, "add_eos_token": tokenizer.add_eos,
        "vocab_size": tokenizer.vocab_size, "model_max_length": service.target.max_context}
    if tokenizer.chat_template is not None:
        fields["chat_template"] = tokenizer.chat_template
    return fields


def tokenized(body: Mapping[str, Any], service: Service) -> dict[str, Any]:
    """The /tokenize reply: `tokens`, `count`, `max_model_len` and, with `return_token_strs`,
    `token_strs` (the vocabulary's strings of the ids)."""
    service.check_model(dict(body))
    tokenizer = _tokenizer(service)
    chat = body.get("messages") is not None
    if chat == (body.get("prompt") is not None):
        raise RequestError("send one of prompt (text) or messages (a chat)",
                           "messages" if chat else "prompt")
    # vLLM's defaults: a text prompt gets the checkpoint's special tokens, a rendered chat
    # none beyond what its template writes.
    special = typed(body, "add_special_tokens", (bool,), "true or false", not chat)
    strings = typed(body, "return_token_strs", (bool,), "true or false", False)
    try:
        if chat:
            refuse_unsupported(body, UNSUPPORTED)
            generation = typed(body, "add_generation_prompt", (bool,), "true or false", True)
            text = tokenizer.render_chat(chat_messages(body["messages"]),
                                         add_generation_prompt=generation)
            ids = tokenizer.encode(checked_text(text, "messages"), add_special_tokens=special)
        else:
            prompt = typed(body, "prompt", (str,), "a string", None)
            ids = tokenizer.encode(checked_text(prompt, "prompt"), add_special_tokens=special)
    except TokenizerError as error:  # the template failed on these messages
        field = "messages" if chat else "prompt"
        raise RequestError(f"{field}: {error}", field) from None
    return {"count": len(ids), "max_model_len": service.target.max_context, "tokens": ids,
            "token_strs": [tokenizer.backend.id_to_token(i) for i in ids] if strings else None}


def detokenized(body: Mapping[str, Any], service: Service) -> str:
    """The text of the body's `tokens` (a list of ids in the vocabulary)."""
    service.check_model(dict(body))
    tokenizer = _tokenizer(service)
    ids = body.get("tokens")
    if not isinstance(ids, list):
        raise RequestError("tokens must be a list of token ids", "tokens")
    for index, value in enumerate(ids):
        if isinstance(value, bool) or not isinstance(value, int) or \
                not 0 <= value < tokenizer.vocab_size:
            raise RequestError(f"tokens[{index}] is {str(value)[:40]}, not a token id in the "
                               f"vocabulary [0, {tokenizer.vocab_size})", f"tokens[{index}]")
    return tokenizer.decode(ids)
