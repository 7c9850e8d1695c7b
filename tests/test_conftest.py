"""The CI guard of tests/conftest.py: with CI=true a C extension that does not import stops the
run at configuration (a failed build only warns, and the tests that need the extensions would
otherwise skip); without CI=true the run goes on and those tests skip."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import C_EXTENSIONS, missing_extensions_error

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def importer(broken: set[str]):
    def import_module(name: str):
        if name in broken:
            raise ImportError(f"No module named {name!r}")
        return object()

    return import_module


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes"])
def test_on_ci_a_missing_extension_is_named(value):
    error = missing_extensions_error({"CI": value}, importer({"exactdraft._sampler"}))
    assert error is not None and "exactdraft._sampler" in error
    assert "exactdraft._cpu_kernels" not in error
    both = missing_extensions_error({"CI": value}, importer(set(C_EXTENSIONS)))
    assert all(name in both for name in C_EXTENSIONS)


@pytest.mark.parametrize("environ", [{}, {"CI": ""}, {"CI": "false"}, {"CI": "0"}])
def test_off_ci_a_missing_extension_stops_nothing(environ):
    assert missing_extensions_error(environ, importer(set(C_EXTENSIONS))) is None


def test_on_ci_built_extensions_pass():
    assert missing_extensions_error({"CI": "true"}, importer(set())) is None


def pytest_in_a_process(ci: str | None) -> subprocess.CompletedProcess:
    """Collect this file in a fresh pytest in which exactdraft._sampler fails to import."""
    code = ("import sys; sys.modules['exactdraft._sampler'] = None; import pytest; "
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '--collect-only', "
            f"{os.path.join('tests', 'test_conftest.py')!r}]))")
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, HF_HUB_OFFLINE="1")
    env.pop("CI", None)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_on_ci_the_run_stops_and_off_ci_it_goes_on():
    stopped = pytest_in_a_process("true")
    assert stopped.returncode == pytest.ExitCode.USAGE_ERROR, stopped.stdout + stopped.stderr
    assert "exactdraft._sampler" in stopped.stderr and "CI=true" in stopped.stderr
    collected = pytest_in_a_process(None)
    assert collected.returncode == pytest.ExitCode.OK, collected.stdout + collected.stderr
    assert "tests collected" in collected.stdout
