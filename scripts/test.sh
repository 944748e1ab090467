#!/usr/bin/env bash
# The test command: set up .venv, lint, type-check, run every test (slow ones too).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# The end-to-end tests spend most of their time waiting on process and Ray
# start-up, not on the CPU, so four workers finish well within 2 cores' budget.
# The runs that start many processes at once take turns (tests/heavy.py).
.venv/bin/python -m pytest -n "${TEST_WORKERS:-4}" "$@"
