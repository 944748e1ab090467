#!/usr/bin/env bash
# Create a venv with a pinned stack: by default .venv with constraints.txt (the
# pinned Flower), or the venv and constraints file given, e.g.
#   bash scripts/setup-env.sh .venv-flwr1.42 constraints-flwr1.42.txt
# Re-runs only when pyproject.toml, the constraints file or this script change,
# so `make run` and `make test` stay fast after the first. .venv also gets
# wheelhouse/: the wheels of every dependency and of the test runner, from
# which tests/packaging installs the built wheel into fresh venvs without the
# network.
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin="${PYTHON:-python3}"
venv="${1:-.venv}"
constraints="${2:-constraints.txt}"
stamp="$venv/.installed-$(cat pyproject.toml "$constraints" scripts/setup-env.sh | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    echo "Setting up $venv from $constraints (first run takes a few minutes)..."
    "$python_bin" -m venv "$venv"
    # torch first and pinned: an unpinned torch pulls several GB of CUDA wheels.
    "$venv/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        -c "$constraints" -e ".[dev,torch,sim,dp]"
    if [ "$venv" = .venv ]; then
        rm -rf "$venv/wheelhouse"
        "$venv/bin/pip" download --quiet --disable-pip-version-check \
            -d "$venv/wheelhouse" -c "$constraints" torch==2.13.0 ".[torch,sim,dp]" \
            pytest pytest-timeout hypothesis filelock
    fi
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
