"""The exactness harness and the `exactdraft check` command, including a case that must fail."""

from __future__ import annotations

import sys

import pytest

import exactdraft as xd
from exactdraft.backends.registry import register_backend
from exactdraft.check import check_exactness, first_divergence
from exactdraft.cli import main
from tests.inexact import KNIFE_PROMPTS, InexactTorchBackend


@pytest.fixture(scope="module", autouse=True)
def inexact_backend_registered():
    """The inexact backend with split-K multi-row products (ulp-level row-count dependence on
    every CPU, no caricature). The check harness compares tokens, so the failing cases below
    run on tests/conftest.py's knife-edge checkpoint, whose greedy tokens flip on any ulp
    change of the hidden state."""
    register_backend("torch-inexact",
                     lambda device=None, dtype=None: InexactTorchBackend(dtype=dtype,
                                                                         split_k=True))


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def assert_drafts_ran(report) -> None:
    assert all(case.drafted.stats.drafting for case in report.cases)
    assert sum(case.drafted.stats.accepted for case in report.cases) > 0
    assert any(row["acceptance"] > 0 for row in report.rows())


def test_check_passes_on_an_exact_backend(tiny_targets):
    generator = xd.Generator(tiny_targets["llama"], xd.PromptLookup(min_match=1))
    report = check_exactness(generator, [[5, 6, 7, 5, 6, 7, 5], [9, 9, 9, 9]], range(3),
                             [xd.SamplingParams(temperature=t) for t in (0.0, 1.0)], 20)
    assert report.passed and len(report.cases) == 12
    assert [row["cases"] for row in report.rows()] == [6, 6]
    assert "identical" in report.table()
    assert_drafts_ran(report)


def test_check_passes_on_the_knife_edge_checkpoint_on_an_exact_backend(knife_edge_checkpoint):
    """The positive twin of the next test: on an invariant backend even a checkpoint whose
    tokens flip on ulp changes gives identical drafted and serial runs."""
    generator = xd.Generator.from_pretrained(knife_edge_checkpoint, backend="torch",
                                             drafter=xd.PromptLookup(min_match=1))
    report = check_exactness(generator, KNIFE_PROMPTS, range(2),
                             [xd.SamplingParams(temperature=0.0)], 40)
    assert report.passed and report.drafting_note is None
    assert_drafts_ran(report)


def test_check_finds_the_divergence_on_an_inexact_backend(knife_edge_checkpoint, one_torch_thread):
    with pytest.warns(RuntimeWarning, match="drafting is off"):
        generator = xd.Generator.from_pretrained(knife_edge_checkpoint,
                                                 backend="torch-inexact",
                                                 drafter=xd.PromptLookup(min_match=1))
    lines = []
    report = check_exactness(generator, KNIFE_PROMPTS, range(2),
                             [xd.SamplingParams(temperature=t) for t in (0.0, 1.0)], 40,
                             on_case=lambda case, done, total: lines.append(
                                 (done, total, case.line())))
    assert [line for _, _, line in lines] == [case.line() for case in report.cases]
    assert [(done, total) for done, total, _ in lines] == [
        (i, len(report.cases)) for i in range(1, len(report.cases) + 1)]
    assert report.drafting_note is not None
    assert_drafts_ran(report)  # the check drafts anyway, to measure what drafting would do
    assert not report.passed
    failure = next(c for c in report.cases if not c.identical).divergence
    assert failure.drafted_token != failure.serial_token
    assert failure.logits_max_difference is None or failure.logits_max_difference > 0
    assert "first difference at output token" in report.failures()
    assert f"DIFFERS from output token {failure.index}" in " ".join(c.line() for c in
                                                                     report.cases)


def test_cli_check_exit_status(tiny_checkpoints, knife_edge_checkpoint, capsys, one_torch_thread):
    folder = tiny_checkpoints["llama"]
    assert main(["check", folder, "--backend", "torch", "--seeds", "2", "--max-new-tokens",
                 "16", "--temperatures", "0,0.8"]) == 0
    assert "all 20 cases identical" in capsys.readouterr().out  # 5 prompts x 2 seeds x 2
    assert main(["check", knife_edge_checkpoint, "--backend", "torch", "--seeds", "1",
                 "--max-new-tokens", "40", "--temperatures", "0", "--raw"]) == 0
    capsys.readouterr()
    with pytest.warns(RuntimeWarning, match="drafting is off"):
        status = main(["check", knife_edge_checkpoint, "--backend", "torch-inexact", "--seeds",
                       "1", "--max-new-tokens", "40", "--temperatures", "0", "--raw"])
    assert status == 1
    assert "first difference" in capsys.readouterr().out


def test_cli_check_prints_a_line_per_case_when_stdout_is_not_a_terminal(tiny_checkpoints,
                                                                       capsys, monkeypatch):
    argv = ["check", tiny_checkpoints["llama"], "--backend", "torch", "--seeds", "2",
            "--max-new-tokens", "8", "--temperatures", "0,0.8", "--raw"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("checking 20 cases (5 prompts x 2 seeds x 2 temperatures), drafted "
                        "against serial; loading the model")
    cases = [line for line in lines if line.startswith("case ")]
    assert len(cases) == 20 and cases[0].startswith("case 1/20: prompt 0, seed 0, t=0: "
                                                    "identical, 8 tokens, acceptance ")
    assert cases[-1].startswith("case 20/20: prompt 4, seed 1, t=0.8: identical")
    assert lines.index(cases[-1]) < lines.index("all 20 cases identical")
    # On a terminal the progress bar shows the cases instead: no case lines.
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert main(argv) == 0
    assert not [line for line in capsys.readouterr().out.splitlines()
                if line.startswith(("case ", "checking "))]


def test_cli_generate_and_compare(tiny_checkpoints, capsys):
    status = main(["generate", tiny_checkpoints["qwen2"], "--backend", "torch", "--prompt",
                   "abcabcabc", "--temperature", "0.6", "--seed", "5", "--max-new-tokens", "12",
                   "--compare"])
    captured = capsys.readouterr()
    assert status == 0
    assert "identical: yes" in captured.err and "seed 5" in captured.err


@pytest.mark.parametrize("argv,needle", [
    (["generate", "/no/such/model", "--prompt", "x"], "no model at"),
    (["generate", "TINY", "--backend", "torch", "--chat", "hi", "--temperature", "-1"],
     "temperature"),
    (["generate", "TINY", "--backend", "nonesuch", "--prompt", "hi"], "unknown backend"),
    (["generate", "TINY", "--backend", "torch", "--drafter", "magic", "--prompt", "hi"],
     "unknown drafter"),
])
def test_cli_errors_are_one_line(tiny_checkpoints, capsys, argv, needle):
    argv = [tiny_checkpoints["llama"] if a == "TINY" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("exactdraft: error:") and needle in err[0]
