#!/usr/bin/env bash
# Create .venv with the pinned stack. Re-runs only when pyproject.toml or
# constraints.txt change, so `make run` and `make test` stay fast after the first.
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin="${PYTHON:-python3}"
venv=.venv
stamp="$venv/.installed-$(cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    echo "Setting up $venv (first run takes about a minute)..."
    "$python_bin" -m venv "$venv"
    # torch first and pinned: an unpinned torch pulls several GB of CUDA wheels.
    "$venv/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        -c constraints.txt -e ".[dev,torch,sim,dp]"
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
