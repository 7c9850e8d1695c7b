"""The command line's constraints (generate --json-schema, --regex, --grammar, --gbnf, --choices)
and `serve --tensor-parallel`: what they run equals the Python API, and bad values are refused by
flag before a model loads."""

from __future__ import annotations

import json
import re
import time

import pytest

import exactdraft as xd
from exactdraft.cli import main
from tests.conftest import needs_smollm2

pytest.importorskip("llguidance")
from exactdraft.constraints import Constraint  # noqa: E402

ASK = "Which city is the capital of Norway? Answer as JSON."
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
          "required": ["city"], "additionalProperties": False}


def run_json(capsys, *arguments: str) -> dict:
    assert main(["generate", "--chat", ASK, "--seed", "3", "--json", "--compare",
                 *arguments]) == 0
    return json.loads(capsys.readouterr().out)


@needs_smollm2
def test_each_flag_constrains_the_reply_as_the_api_does(capsys, tmp_path):
    grammar = tmp_path / "answer.lark"
    grammar.write_text('start: "The capital is " CITY "."\nCITY: "Oslo" | "Bergen"\n')
    gbnf = tmp_path / "answer.gbnf"
    gbnf.write_text('root ::= "The capital is " ("Oslo" | "Bergen") "."\n')
    cases = [(("--json-schema", json.dumps(SCHEMA)), Constraint.json_schema(SCHEMA)),
             (("--regex", "[A-Z][a-z]+"), Constraint.regex("[A-Z][a-z]+")),
             (("--grammar", str(grammar)), Constraint.grammar(grammar.read_text())),
             (("--gbnf", str(gbnf)), Constraint.gbnf(gbnf.read_text())),
             (("--choices", "Oslo,Bergen"), Constraint.choices(["Oslo", "Bergen"]))]
    generator = xd.Generator.from_pretrained(None, drafter=xd.PromptLookup(), progress=False)
    for flags, constraint in cases:
        document = run_json(capsys, "--temperature", "0.7", *flags)
        assert document["identical"] is True  # drafted == serial
        expected = generator.generate([{"role": "user", "content": ASK}], seed=3,
                                      temperature=0.7, constraint=constraint)
        assert document["tokens"] == expected.tokens, flags
    assert json.loads(run_json(capsys, "--json-schema", json.dumps(SCHEMA))["text"])["city"]
    assert re.fullmatch("[A-Z][a-z]+", run_json(capsys, "--regex", "[A-Z][a-z]+")["text"])


def test_the_flags_and_the_server_field_come_from_one_table_of_kinds():
    """Every row of constraints/kinds.py is a generate flag and a key of the server's
    `constraint` field, and nothing else is: a kind added to the table is offered by both."""
    from exactdraft.cli import build_parser
    from exactdraft.constraints.kinds import KINDS
    from exactdraft.server.fields import RequestError, constraint_from

    generate = next(action for action in build_parser()._actions
                    if getattr(action, "choices", None) and "generate" in action.choices)
    group = next(group for group in generate.choices["generate"]._mutually_exclusive_groups
                 if any(action.dest == "regex" for action in group._group_actions))
    flags = {option for action in group._group_actions for option in action.option_strings}
    assert flags == {kind.flag for kind in KINDS}
    assert {"--gbnf", "--json-schema", "--regex", "--grammar", "--choices"} <= flags
    with pytest.raises(RequestError) as refused:
        constraint_from({"constraint": {"lark": "start: \"a\""}})
    assert str(refused.value).endswith(", ".join(kind.name for kind in KINDS))
    built = constraint_from({"constraint": {"gbnf": 'root ::= "yes" | "no"\n'}}).build(None)
    assert built == Constraint.gbnf('root ::= "yes" | "no"\n')


@pytest.mark.parametrize("flags, named", [
    (("--regex", "a{"), "--regex"),
    (("--json-schema", "{not json"), "--json-schema"),
    (("--json-schema", '{"type": "no-such-type"}'), "--json-schema"),
    (("--grammar", "/no/such/file.lark"), "--grammar"),
    (("--gbnf", "/no/such/file.gbnf"), "--gbnf"),
    (("--choices", ","), "--choices"),
])
def test_bad_constraints_are_refused_before_loading(capsys, monkeypatch, flags, named):
    from exactdraft.cli import commands

    def no_loading(args):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(commands, "load_generator", no_loading)
    assert main(["generate", "--chat", ASK, *flags]) == 2
    assert named in capsys.readouterr().err


def test_serve_refuses_a_bad_tensor_parallel_count(capsys, monkeypatch):
    from exactdraft.cli import commands

    monkeypatch.setattr(commands, "load_generator", lambda args: None)
    assert main(["serve", "--tensor-parallel", "0"]) == 2
    assert "--tensor-parallel" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_with_two_ranks_answers_as_one_rank(tiny_checkpoints):
    from exactdraft.results import token_digest
    from tests.server.live import post, server_process

    pytest.importorskip("uvicorn")
    folder = tiny_checkpoints["llama"]
    body = {"model": "tiny", "prompt": "abcabcabc", "max_tokens": 16, "temperature": 0.8,
            "seed": 5}
    with server_process(folder, "--backend", "torch", "--model-name", "tiny",
                        "--tensor-parallel", "2") as base:
        status, reply = post(base, "/v1/completions", body)
    assert status == 200, reply
    # The ranks end with the command that started them: nothing answers there any more.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            post(base, "/v1/completions", body, timeout=2)
        except OSError:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("a rank still serves after its launcher ended")
    generator = xd.Generator.from_pretrained(folder, "torch", drafter=xd.PromptLookup(),
                                             progress=False)
    expected = generator.generate("abcabcabc", 16, temperature=0.8, seed=5)
    assert reply["choices"][0]["receipt"]["token_ids_sha256"] == token_digest(expected.tokens)
    assert reply["choices"][0]["text"] == expected.text


@pytest.mark.parametrize("where, says", [("folder", "is a folder"),
                                         ("missing/prefixes.safetensors", "does not exist")])
def test_serve_refuses_a_cache_file_it_cannot_write_before_loading(capsys, monkeypatch,
                                                                   tmp_path, where, says):
    from exactdraft.cli import commands

    def no_loading(args):
        raise AssertionError("the model was loaded")

    (tmp_path / "folder").mkdir()
    monkeypatch.setattr(commands, "load_generator", no_loading)
    assert main(["serve", "--prefix-cache-file", str(tmp_path / where)]) == 2
    assert says in capsys.readouterr().err


def test_special_tokens_declare_what_a_grammar_names(capsys, monkeypatch, tmp_path):
    """--special-tokens with --grammar (or --gbnf) builds the constraint the Python API
    builds with special_tokens; without it the grammar is refused with the CLI's way to
    declare them; with another kind, or alone, it is refused by flag. None loads a model."""
    from exactdraft.cli import build_parser, commands
    from exactdraft.cli.prompts import read_constraint

    def no_loading(args):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(commands, "load_generator", no_loading)
    grammar = tmp_path / "channel.lark"
    grammar.write_text('start: "go" <|channel|> /[a-z]+/ <|message|>\n')
    parser = build_parser()
    for flag, build in (("--grammar", Constraint.grammar), ("--gbnf", Constraint.gbnf)):
        args = parser.parse_args(["generate", "--chat", ASK, flag, str(grammar),
                                  "--special-tokens", "<|message|>,<|channel|>"])
        built = read_constraint(args)
        assert built == build(grammar.read_text().rstrip("\n"),
                              special_tokens=["<|channel|>", "<|message|>"])
        assert built.special_tokens == ("<|channel|>", "<|message|>")
    for flags, says in [
            (("--grammar", str(grammar)), "declares them: --special-tokens NAME,..."),
            (("--grammar", str(grammar), "--special-tokens", "<|channel|>"),
             "unknown special token"),
            (("--grammar", str(grammar), "--special-tokens", "<|channel|>,message"),
             "--grammar: special_tokens[1]"),
            (("--regex", "a", "--special-tokens", "<|channel|>"),
             "--special-tokens goes with --grammar or --gbnf"),
            (("--special-tokens", "<|channel|>"), "--special-tokens goes with")]:
        assert main(["generate", "--chat", ASK, *flags]) == 2, flags
        error = capsys.readouterr().err
        assert says in error, (flags, error)
        assert "Constraint.grammar(" not in error
