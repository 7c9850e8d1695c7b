"""benchmarks/record.py: a record holds the command, date, machine, SIMD level, commit and the
command's stdout; a command that fails leaves no file and its exit code is passed on."""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import record  # noqa: E402

SCRIPT = ROOT / "benchmarks" / "record.py"


def run_record(out: Path, name: str, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), name, "--out", str(out), "--", *command],
                          capture_output=True, text=True, timeout=120)


def header_fields(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        match = re.fullmatch(r"# ([a-z ]+):\s+(.*)", line)
        if match:
            fields[match.group(1)] = match.group(2)
    return fields


def test_a_record_holds_the_header_and_the_raw_output(tmp_path):
    command = [sys.executable, "-c", "print('first line'); print('  second\\tline')"]
    done = run_record(tmp_path, "trivial", *command)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "first line\n  second\tline\n"      # streamed to the terminal too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trivial.txt"]
    text = (tmp_path / "trivial.txt").read_text()
    fields = header_fields(text)
    assert fields["command"] == shlex.join(command)
    date = datetime.datetime.strptime(fields["date"], "%Y-%m-%d %H:%M:%S UTC")
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    assert abs((now - date).total_seconds()) < 120
    assert fields["machine"].startswith(record.cpu_model())
    assert f"{os.cpu_count()} logical cores" in fields["machine"]
    assert f"may use {len(os.sched_getaffinity(0))} (" in fields["machine"]
    assert re.fullmatch(rf"\d+\.\d\d \(1 min\) on {os.cpu_count()} logical cores",
                        fields["load average"])
    from exactdraft.kernels import cpu
    assert fields["simd level"] == cpu.simd_level()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()
    assert fields["commit"].split()[0] == head
    assert fields["python"] == platform.python_version()
    import torch
    assert fields["torch"] == torch.__version__
    # The output sits after the header unchanged, then the wall time.
    body = text.split("#\n", 1)[1]
    assert body.startswith("first line\n  second\tline\n#\n# exit 0 after ")


def test_a_failing_command_leaves_nothing_and_passes_its_exit_code_on(tmp_path):
    (tmp_path / "kept.txt").write_text("an older record\n")
    done = run_record(tmp_path, "kept", sys.executable, "-c", "print('partial'); raise "
                      "SystemExit(3)")
    assert done.returncode == 3
    assert "partial" in done.stdout and "no record written" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt"]
    assert (tmp_path / "kept.txt").read_text() == "an older record\n"


def test_a_command_that_cannot_start_leaves_nothing(tmp_path):
    done = run_record(tmp_path, "missing", str(tmp_path / "no-such-program"))
    assert done.returncode == 127
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["name", "--out", "x"], ["../escape", "--", "true"]])
def test_bad_arguments_are_refused(tmp_path, argv):
    done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "error" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_commit_is_marked_when_measured_files_change(tmp_path, monkeypatch):
    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=tmp_path, capture_output=True, text=True,
                              check=True).stdout.strip()
    git("init", "-q")
    (tmp_path / "exactdraft").mkdir()
    (tmp_path / "exactdraft" / "kernel.py").write_text("x = 1\n")
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "dot.c").write_text("int x;\n")
    (tmp_path / "notes.md").write_text("notes\n")
    git("add", ".")
    git("commit", "-qm", "first")
    monkeypatch.setattr(record, "ROOT", tmp_path)
    head = git("rev-parse", "HEAD")
    assert record.commit() == head
    # Neither an untracked file nor a change outside the measured paths marks it.
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "new.py").write_text("")
    (tmp_path / "notes.md").write_text("edited\n")
    assert record.commit() == head
    (tmp_path / "exactdraft" / "kernel.py").write_text("x = 2\n")
    assert record.commit() == head + " + uncommitted changes (exactdraft/kernel.py)"
    (tmp_path / "csrc" / "dot.c").write_text("int y;\n")
    assert record.commit() == (head + " + uncommitted changes (csrc/dot.c, "
                               "exactdraft/kernel.py)")
