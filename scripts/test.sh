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
# The runs that start many processes at once take turns anyway (-m heavy,
# tests/heavy.py): one pytest serves them from the start, beside one that runs
# the rest on the other workers, each in its own temporary folder.
workers="${TEST_WORKERS:-4}"
rest_workers=$((workers > 1 ? workers - 1 : 1))
heavy_log="$(mktemp)"
.venv/bin/python -m pytest -p no:cacheprovider -m heavy -n 1 \
    --basetemp "$(mktemp -d)/heavy" "$@" >"$heavy_log" 2>&1 &
heavy_pid=$!
trap 'kill "$heavy_pid" 2>/dev/null || true' EXIT
status=0
.venv/bin/python -m pytest -m "not heavy" -n "$rest_workers" \
    --basetemp "$(mktemp -d)/rest" "$@" || status=1
# Every other supported Flower release (CONTRIBUTING.md, "Flower versions"),
# one constraints-flwr<minor>.txt each, in its own venv: the fast tier covers the
# library's use of Flower's API; the slow end-to-end runs stay on the pinned
# release. It runs beside the last heavy runs, which leave cores idle while
# they wait on their processes.
for constraints in constraints-flwr*.txt; do
    minor="${constraints#constraints-flwr}"
    venv=".venv-flwr${minor%.txt}"
    bash scripts/setup-env.sh "$venv" "$constraints"
    flwr_version=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("flwr"))')
    echo "Fast tier (-m 'not slow') on flwr $flwr_version ($constraints):"
    "$venv/bin/python" -m pytest -p no:cacheprovider -n "$rest_workers" \
        -m "not slow" --basetemp "$(mktemp -d)/$venv" || status=1
done
wait "$heavy_pid" || status=1
echo "Heavy runs (-m heavy) on the pinned Flower:"
cat "$heavy_log"
exit "$status"
