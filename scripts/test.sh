#!/usr/bin/env bash
# The test command: set up .venv, lint, type-check, run every test (slow ones
# too) on the pinned Flower (constraints.txt), then the fast tier on each other
# supported Flower minor (constraints-flwr1.42.txt in .venv-flwr1.42, ...).
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
# Every other supported Flower release (CONTRIBUTING.md, "Flower versions"),
# one constraints-flwr<minor>.txt each, in its own venv: the fast tier covers the
# library's use of Flower's API; the slow end-to-end runs stay on the pinned
# release, which keeps this command under ~35 minutes.
for constraints in constraints-flwr*.txt; do
    minor="${constraints#constraints-flwr}"
    venv=".venv-flwr${minor%.txt}"
    bash scripts/setup-env.sh "$venv" "$constraints"
    flwr_version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("flwr"))')
    echo "Fast tier (-m 'not slow') on flwr $flwr_version ($constraints):"
    "$venv/bin/python" -m pytest -n "${TEST_WORKERS:-4}" -m "not slow"
done
