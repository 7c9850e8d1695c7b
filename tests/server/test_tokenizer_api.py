"""vLLM's tokenizer endpoints: /tokenize gives the ids the generating endpoints prompt with
(text with and without the checkpoint's special tokens, chat messages through its template),
/detokenize gives the text back, /tokenizer_info what a remote tokenizer client needs, and a
bad body gets a 400 naming the field."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import exactdraft as xd
from tests.server.conftest import MODEL
from tests.server.live import get, post, server_in_thread

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "abc abc"}]


@pytest.fixture(scope="module")
def bos_server(tiny_checkpoints, tmp_path_factory):
    """(base url, tokenizer) of a server of the tiny llama whose tokenizer adds <s>."""
    folder = str(tmp_path_factory.mktemp("bos") / "llama")
    shutil.copytree(tiny_checkpoints["llama"], folder)
    config_file = os.path.join(folder, "tokenizer_config.json")
    with open(config_file) as handle:
        config = json.load(handle)
    with open(config_file, "w") as handle:
        json.dump({**config, "add_bos_token": True}, handle)
    generator = xd.Generator.from_pretrained(folder, "torch", progress=False)
    with server_in_thread(generator, MODEL, max_sequences=1) as (base, _):
        yield base, generator.tokenizer


def test_text_with_and_without_special_tokens(bos_server) -> None:
    base, tokenizer = bos_server
    plain = tokenizer.encode("abc abc", add_special_tokens=False)
    status, bare = post(base, "/tokenize", {"prompt": "abc abc", "add_special_tokens": False})
    assert status == 200 and bare["tokens"] == plain
    status, special = post(base, "/tokenize", {"prompt": "abc abc"})  # vLLM's default: true
    assert status == 200 and special["tokens"] == [tokenizer.bos_token_id, *plain]
    assert special["count"] == len(plain) + 1 and special["max_model_len"] == 1024
    assert special["token_strs"] is None
    status, named = post(base, "/tokenize", {"prompt": "ab", "return_token_strs": True})
    assert named["token_strs"] == ["<s>", "a", "b"]


def test_the_completion_prompt_is_the_tokenized_text(bos_server) -> None:
    base, _ = bos_server
    status, tokenized = post(base, "/tokenize", {"prompt": "hello there"})
    status, completion = post(base, "/v1/completions",
                              {"prompt": "hello there", "max_tokens": 0, "echo": True,
                               "logprobs": 0})
    assert status == 200
    assert completion["usage"]["prompt_tokens"] == tokenized["count"]
    assert "".join(completion["choices"][0]["logprobs"]["tokens"]) == "<s>hello there"


def test_chat_messages_are_the_chat_completion_prompt(live, served_generator) -> None:
    base, _ = live
    tokenizer = served_generator.tokenizer
    status, tokenized = post(base, "/tokenize", {"messages": CHAT})
    assert status == 200
    rendered = "<system>be brief</s><user>abc abc</s><assistant>"
    assert tokenized["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    status, chat = post(base, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1})
    assert chat["usage"]["prompt_tokens"] == tokenized["count"]
    status, open_ended = post(base, "/tokenize", {"messages": CHAT,
                                                  "add_generation_prompt": False})
    assert open_ended["tokens"] == tokenized["tokens"][:-len("<assistant>")]


def test_chat_messages_with_special_tokens(bos_server) -> None:
    base, tokenizer = bos_server
    status, bare = post(base, "/tokenize", {"messages": CHAT})  # vLLM's default: false
    status, special = post(base, "/tokenize", {"messages": CHAT, "add_special_tokens": True})
    assert bare["tokens"][0] != tokenizer.bos_token_id
    assert special["tokens"] == [tokenizer.bos_token_id, *bare["tokens"]]


@pytest.mark.parametrize("text", ["abc abc", "a\tb\nc </s> <s>", "~!@#$%^&*()", ""])
def test_tokenize_then_detokenize_is_the_text(live, text) -> None:
    base, _ = live
    status, tokenized = post(base, "/tokenize", {"prompt": text, "model": MODEL})
    assert status == 200
    status, detokenized = post(base, "/detokenize", {"tokens": tokenized["tokens"]})
    assert status == 200 and detokenized == {"prompt": text}


def test_tokenizer_info_names_the_special_tokens(live, served_generator) -> None:
    base, _ = live
    info = get(base, "/tokenizer_info")
    tokenizer = served_generator.tokenizer
    assert info["eos_token"] == "</s>" and info["bos_token"] == "<s>"
    assert info["chat_template"] == tokenizer.chat_template
    assert info["model_max_length"] == 1024 and info["add_bos_token"] is False
    # what a remote tokenizer does with it: the eos id is the first id of its text
    status, eos = post(base, "/tokenize", {"prompt": info["eos_token"],
                                           "add_special_tokens": False})
    assert eos["tokens"] == [tokenizer.eos_token_id] == [info["eos_token_id"]]


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": CHAT}, "messages"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"prompt": "a", "return_token_strs": 1}, "return_token_strs"),
    ("/tokenize", {"messages": [{"role": "robot", "content": "a"}]}, "messages[0].role"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": CHAT, "add_generation_prompt": None, "tools": [{}]}, "tools"),
    ("/tokenize", {"prompt": "\ud800"}, "prompt"),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
    ("/detokenize", {"tokens": [1, 2, 100000]}, "tokens[2]"),
    ("/detokenize", {"tokens": [1, -1]}, "tokens[1]"),
    ("/detokenize", {"tokens": [True]}, "tokens[0]"),
    ("/detokenize", {"tokens": [1.5]}, "tokens[0]"),
])
def test_bad_bodies_name_the_field(live, path, body, field) -> None:
    base, _ = live
    status, reply = post(base, path, body)
    assert status == 400, reply
    assert reply["error"]["param"] == field and reply["error"]["type"] == \
        "invalid_request_error"



def test_a_model_without_a_tokenizer_refuses_all_three() -> None:
    from types import SimpleNamespace

    from exactdraft.server.fields import RequestError
    from exactdraft.server.tokenizer_api import detokenized, info, tokenized

    service = SimpleNamespace(tokenizer=None, check_model=lambda body: None)
    for ask in (lambda: info(service), lambda: tokenized({"prompt": "a"}, service),
                lambda: detokenized({"tokens": [1]}, service)):
        with pytest.raises(RequestError, match="no tokenizer") as refused:
            ask()
        assert refused.value.status == 400
