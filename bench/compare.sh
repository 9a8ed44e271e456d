#!/bin/sh
# Benchmarks on REV and on the working tree in one run, with ratios: see bench/compare.py.
exec "$(dirname "$0")/../.venv/bin/python" "$(dirname "$0")/compare.py" "$@"
