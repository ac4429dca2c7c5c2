#!/usr/bin/env bash
# The test command: sets up .venv with the test extra (scripts/setup.sh) and runs pytest, slow tests
# included. Extra arguments go to pytest, e.g. -m "not slow".
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
exec .venv/bin/python -m pytest "$@"
