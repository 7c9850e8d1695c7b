"""Run one benchmark command and keep its output as a record under docs/benchmarks.

    python benchmarks/record.py verify_cost -- python benchmarks/verify_cost.py --repeats 15

writes docs/benchmarks/verify_cost.txt: a header naming the exact command, the date (UTC), the
machine (CPU model, logical cores, the cores this process may use), the load average (on a
shared machine, how much else ran), the SIMD level exactdraft's CPU kernels run at, the commit
measured (with "+ uncommitted changes" and the files when exactdraft/, csrc/, setup.py or
benchmarks/ differ from it) and the Python and torch versions; then the command's stdout, byte
for byte as it printed it (also streamed to this terminal); then its wall time.

The invariant it keeps: a record file exists only for a command that exited 0. The record is
written to a temporary file beside its destination and renamed into place at the end, so a
failed or interrupted run leaves nothing (and an older record of the same name untouched), and
the command's exit code is passed on.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "benchmarks"
# Changes here make a measurement differ from the commit it names: the package, the C sources
# its extension is built from, and the benchmarks.
MEASURED_PATHS = ("exactdraft", "csrc", "setup.py", "benchmarks")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo where there is one, else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":")[0].strip() in ("model name", "Processor", "Hardware"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> str:
    """The logical cores this process may run on (its affinity), e.g. '2 (0-1)'."""
    if not hasattr(os, "sched_getaffinity"):
        return f"{os.cpu_count()} (no affinity on this platform)"
    cores = sorted(os.sched_getaffinity(0))
    runs: list[list[int]] = []
    for core in cores:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    spans = [f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs]
    return f"{len(cores)} ({','.join(spans)})"


def simd_level() -> str:
    """The level exactdraft's CPU kernels dispatch to here, asked in a child process so that
    this script imports neither the package nor torch."""
    done = subprocess.run(
        [sys.executable, "-c", "from exactdraft.kernels import cpu; print(cpu.simd_level())"],
        cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
            str(ROOT), os.environ.get("PYTHONPATH")]))})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"unavailable ({last})"
    return done.stdout.strip()


def commit() -> str:
    """HEAD, marked (naming the files) when tracked files under the measured paths differ
    from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout
    try:
        head = git("rev-parse", "HEAD").strip()
        changed = [line[3:] for line in git("status", "--porcelain", "--", *MEASURED_PATHS)
                   .splitlines() if not line.startswith("??")]
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    if not changed:
        return head
    named = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return f"{head} + uncommitted changes ({named})"


def load_average() -> str:
    """The 1-minute load average against the core count: on a shared machine, how much else ran."""
    if not hasattr(os, "getloadavg"):
        return "unknown"
    return f"{os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} logical cores"


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def header(command: list[str], started: datetime.datetime) -> str:
    fields = {
        "command": shlex.join(command),
        "date": started.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "machine": f"{cpu_model()}, {os.cpu_count()} logical cores, "
                   f"this process may use {usable_cores()}",
        "load average": load_average(),
        "simd level": simd_level(),
        "commit": commit(),
        "python": platform.python_version(),
        "torch": version("torch"),
    }
    width = max(map(len, fields))
    lines = [f"# {name + ':':<{width + 1}} {value}" for name, value in fields.items()]
    return "\n".join(lines) + "\n#\n"


def record(name: str, command: list[str], out: Path) -> int:
    """Run `command`, streaming its stdout; on exit 0 keep it as out/<name>.txt. Returns the
    command's exit code (127 when it cannot be started)."""
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now(datetime.timezone.utc)
    handle = tempfile.NamedTemporaryFile("wb", dir=out, prefix=f".{name}.", suffix=".part",
                                         delete=False)
    temporary = Path(handle.name)
    try:
        with handle:
            handle.write(header(command, started).encode())
            clock = time.perf_counter()
            try:
                # Unbuffered, so that the terminal sees each line as the benchmark prints it.
                process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
            except OSError as error:
                print(f"record.py: cannot run {command[0]!r}: {error}", file=sys.stderr)
                return 127
            try:
                for line in iter(process.stdout.readline, b""):
                    handle.write(line)
                    sys.stdout.buffer.write(line)
                    sys.stdout.buffer.flush()
            finally:
                code = process.wait()
            seconds = time.perf_counter() - clock
            if code != 0:
                print(f"record.py: the command exited {code}; no record written",
                      file=sys.stderr)
                return code
            handle.write(f"#\n# exit 0 after {seconds:.1f} s wall time; load average at the end "
                         f"{load_average()}\n".encode())
        target = out / f"{name}.txt"
        os.replace(temporary, target)
        print(f"record.py: wrote {target} ({seconds:.1f} s)", file=sys.stderr)
        return 0
    finally:
        temporary.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s NAME [--out DIR] -- COMMAND [ARGS...]")
    parser.add_argument("name", help="the record's file name, without .txt")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"folder for the record (default: {DEFAULT_OUT.relative_to(ROOT)})")
    # Everything after the first "--" is the command, untouched by this parser.
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("no command given: put it after --")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", args.name):
        parser.error(f"name {args.name!r}: use letters, digits, '_', '.' and '-' only")
    return record(args.name, command, args.out)

if __name__ == "__main__":
    sys.exit(main())
