"""What coding agents call, through the official clients: Anthropic count_tokens, any model
name (and the alias map that makes names strict), cached prompt tokens in usage from prefix-
cache hits, `system` as blocks and system entries in `messages`, and optional or newer fields
accepted rather than refused."""

from __future__ import annotations

import pytest

from tests.server.conftest import MODEL
from tests.server.live import server_in_thread

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

BLOCK = 16  # the prefix cache's block_tokens (exactdraft.engine.PrefixCache default)


@pytest.fixture(scope="module")
def clients(live):
    base, _ = live
    return (openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0),
            anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0))


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_count_tokens_equals_the_input_tokens_of_the_same_request(clients) -> None:
    _, claude = clients
    request = dict(model=MODEL, system="be brief", messages=user("count these words, once"))
    counted = claude.messages.count_tokens(**request)
    message = claude.messages.create(max_tokens=3, **request)
    assert message.usage.cache_read_input_tokens == 0  # a prompt not seen before
    assert counted.input_tokens == message.usage.input_tokens > 0
    other = claude.messages.count_tokens(model=MODEL, messages=user("count these words"))
    assert other.input_tokens < counted.input_tokens  # no system prompt, fewer words
    # a prompt beyond the context is still counted (a client sizes its prompt this way)
    huge = claude.messages.count_tokens(model=MODEL, messages=user("abc " * 600))
    assert huge.input_tokens > 1024


def test_any_model_name_is_served_and_reported_as_the_served_model(clients,
                                                                   served_generator) -> None:
    client, claude = clients
    alone = served_generator.generate(user("abc abc"), drafts=False, max_new_tokens=8,
                                      temperature=0.9, seed=3)
    chat = client.chat.completions.create(model="gpt-4o", messages=user("abc abc"),
                                          max_tokens=8, temperature=0.9, seed=3)
    assert chat.model == MODEL and chat.choices[0].message.content == alone.text
    message = claude.messages.create(model="claude-sonnet-4-5", messages=user("abc abc"),
                                     max_tokens=8, extra_body={"temperature": 0.9, "seed": 3})
    assert message.model == MODEL and message.content[0].text == alone.text


def test_an_alias_map_lists_its_names_and_refuses_others(served_generator) -> None:
    with server_in_thread(served_generator, MODEL,
                          model_aliases={"gpt-4o": MODEL, "claude-x": MODEL}) as (base, _):
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == [MODEL, "claude-x", "gpt-4o"]
        assert client.completions.create(model="gpt-4o", prompt="abc", max_tokens=2).model \
            == MODEL
        assert claude.messages.create(model="claude-x", max_tokens=2,
                                      messages=user("abc")).model == MODEL
        with pytest.raises(openai.NotFoundError) as refused:
            client.completions.create(model="gpt-5", prompt="abc", max_tokens=2)
        assert refused.value.body["param"] == "model"
        with pytest.raises(anthropic.NotFoundError):
            claude.messages.create(model="claude-y", max_tokens=2, messages=user("abc"))


def test_an_alias_for_another_model_is_refused_before_serving(served_generator) -> None:
    from exactdraft.errors import ParameterError

    with pytest.raises(ParameterError, match="other-model"):
        with server_in_thread(served_generator, MODEL, model_aliases={"x": "other-model"}):
            pass


def test_usage_reports_cached_prompt_tokens(clients, served_generator) -> None:
    """A prompt sent again is answered from its cached prefix: every whole block of its
    tokens but the last is reported as cached, in both APIs, and the reply is the same."""
    client, claude = clients
    prompt = user("the cached prompt is long enough to fill a few blocks: " + "x y z " * 12)
    first = client.chat.completions.create(model=MODEL, messages=prompt, max_tokens=6,
                                           temperature=0.8, seed=1)
    again = client.chat.completions.create(model=MODEL, messages=prompt, max_tokens=6,
                                           temperature=0.8, seed=1)
    prompt_tokens = first.usage.prompt_tokens
    assert prompt_tokens > 3 * BLOCK
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == \
        (prompt_tokens - 1) // BLOCK * BLOCK
    assert again.choices[0].message.content == first.choices[0].message.content
    streamed = list(client.chat.completions.create(
        model=MODEL, messages=prompt, max_tokens=6, temperature=0.8, seed=1, stream=True,
        stream_options={"include_usage": True}))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == \
        (prompt_tokens - 1) // BLOCK * BLOCK

    text = "an anthropic prompt long enough to fill some blocks: " + "p q r " * 12
    cold = claude.messages.create(model=MODEL, max_tokens=4, messages=user(text))
    warm = claude.messages.create(model=MODEL, max_tokens=4, messages=user(text))
    whole = cold.usage.input_tokens
    assert cold.usage.cache_read_input_tokens == 0
    assert warm.usage.cache_read_input_tokens == (whole - 1) // BLOCK * BLOCK > 0
    assert warm.usage.input_tokens + warm.usage.cache_read_input_tokens == whole
    with claude.messages.stream(model=MODEL, max_tokens=4, messages=user(text)) as stream:
        final = stream.get_final_message()
    assert final.usage.cache_read_input_tokens == warm.usage.cache_read_input_tokens
    assert final.usage.input_tokens == warm.usage.input_tokens
    counted = claude.messages.count_tokens(model=MODEL, messages=user(text))
    assert counted.input_tokens == whole


def test_system_blocks_and_system_entries_in_messages(clients, served_generator) -> None:
    """`system` as text blocks (with cache_control) and system entries inside `messages` make
    the one system prompt they spell, joined in order."""
    _, claude = clients
    alone = served_generator.generate(
        [{"role": "system", "content": "be brief\n\nanswer in lowercase"}, *user("abc abc")],
        drafts=False, max_new_tokens=10, temperature=0.7, seed=9)
    options = dict(model=MODEL, max_tokens=10, extra_body={"temperature": 0.7, "seed": 9})
    blocks = claude.messages.create(
        system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "system", "content": "answer in lowercase"}, *user("abc abc")],
        **options)
    assert blocks.content[0].text == alone.text
    string = claude.messages.create(system="be brief\n\nanswer in lowercase",
                                    messages=user("abc abc"), **options)
    assert string.content[0].text == alone.text
    other = claude.messages.create(system="be brief", messages=user("abc abc"), **options)
    assert other.model_extra["receipt"]["prompt_ids_sha256"] != \
        blocks.model_extra["receipt"]["prompt_ids_sha256"]  # the system text did reach it


def test_optional_and_newer_fields_are_accepted(clients, served_generator) -> None:
    client, claude = clients
    alone = served_generator.generate(user("abc abc"), drafts=False, max_new_tokens=6,
                                      temperature=0.5, seed=2)
    chat = client.chat.completions.create(
        model=MODEL, messages=user("abc abc"), max_completion_tokens=6, temperature=0.5,
        seed=2, user="someone", store=False, metadata={"k": "v"}, service_tier="auto",
        prediction={"type": "content", "content": "abc"}, reasoning_effort="low",
        modalities=["text"])
    assert chat.choices[0].message.content == alone.text
    message = claude.messages.create(
        model=MODEL, messages=user("abc abc"), max_tokens=6, metadata={"user_id": "u"},
        service_tier="auto", thinking={"type": "disabled"},
        extra_body={"temperature": 0.5, "seed": 2})
    assert message.content[0].text == alone.text


def test_serve_refuses_an_alias_for_another_model_before_loading(tiny_checkpoints, capsys,
                                                                  monkeypatch) -> None:
    import exactdraft.cli as cli
    from exactdraft.cli import commands

    def no_loading(args):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(commands, "load_generator", no_loading)
    folder = tiny_checkpoints["llama"]
    status = cli.main(["serve", folder, "--model-name", "tiny", "--model-alias", "x=other"])
    assert status == 2 and "'x' names 'other'" in capsys.readouterr().err
