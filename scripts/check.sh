#!/usr/bin/env bash
# The quick check while you work: set up .venv, lint, type-check, and run the
# fast tier (every test not marked slow). `make test` runs everything (CI).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/python -m pytest -n "${TEST_WORKERS:-2}" -m "not slow" -q "$@"
