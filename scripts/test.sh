#!/usr/bin/env bash
# The test command: sets up .venv with the test extra (scripts/setup.sh) and runs the fast tests
# (setup.cfg's default -m "not slow") in one worker process per core (at most 4; the suite is
# CPU-bound), then the tests marked `alone` (they train for minutes of wall clock and need the
# machine to themselves). Extra arguments go to both pytest runs; a -m among them replaces the
# default: -m slow runs the slow end-to-end tests (.ci/run runs them after the fast ones), -m ""
# every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
workers=$(nproc 2>/dev/null || echo 1)
workers=$(( workers > 4 ? 4 : workers ))
parallel=()
if (( workers > 1 )); then
  parallel=(-n "$workers" --dist loadgroup)  # a module's fast tests together (conftest.py)
fi
# pytest exits 5 where its arguments select no test: fine for one of the two runs.
status=0
.venv/bin/python -m pytest "${parallel[@]}" --alone-tests=skip "$@" || status=$?
alone=0
.venv/bin/python -m pytest --alone-tests=only "$@" || alone=$?
if (( status == 5 && alone != 5 )); then status=0; fi
if (( alone == 5 && status != 5 )); then alone=0; fi
exit $(( status != 0 ? status : alone ))
