#!/usr/bin/env bash
# Makes .venv (if missing) and installs the package into it, with the extras named
# as arguments (test.sh: "test"; quickstart.sh: none). Safe to run again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
extras=$(IFS=,; echo "$*")
.venv/bin/python -m pip install --quiet -e ".${extras:+[$extras]}"
