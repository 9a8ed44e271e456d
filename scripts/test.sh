#!/usr/bin/env bash
# Set up a venv (.venv) with firstfault and its test dependencies, then run the
# catalog checks and the test suite. Used by CI (.ci/run) and by people alike.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
.venv/bin/firstfault rules lint
.venv/bin/firstfault rules test
.venv/bin/python -m pytest -q "$@"
