#!/usr/bin/env bash
# Makes .venv (if missing) and installs the package into it, with the extras named
# as arguments (test.sh: "test"; quickstart.sh: none), and "gpu" on a machine with
# an NVIDIA GPU. Safe to run again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${PYTHON:-python3}
# pip's and setuptools' notices only when a step fails.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
quietly() {
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  quietly .venv/bin/python -m pip install --quiet --upgrade pip
fi
# Where nvidia-smi lists a GPU, TensorFlow's CUDA libraries too (the gpu extra).
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  set -- "$@" gpu
fi
extras=$(IFS=,; echo "$*")
quietly .venv/bin/python -m pip install --quiet -e ".${extras:+[$extras]}"
