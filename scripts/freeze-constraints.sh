#!/usr/bin/env bash
# Regenerate a constraints file for one Flower release, the same way for every
# release: a fresh venv, torch pinned first (CPU), the library with every extra
# and that Flower release, then `pip freeze`. CONTRIBUTING.md ("Flower versions")
# says which file each release writes.
#   bash scripts/freeze-constraints.sh 1.41.0 constraints.txt
#   bash scripts/freeze-constraints.sh 1.42.0 constraints-flwr1.42.txt
set -euo pipefail
cd "$(dirname "$0")/.."
flwr_version="$1"
output="$2"
python_bin="${PYTHON:-python3}"
venv="$(mktemp -d)/venv"
trap 'rm -rf "$(dirname "$venv")"' EXIT
"$python_bin" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check torch==2.13.0
"$venv/bin/pip" install --quiet --disable-pip-version-check \
    -e ".[dev,torch,sim,dp]" "flwr==$flwr_version"
"$venv/bin/pip" check
{
    echo "# Tested stack (Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'), CPU, flwr $flwr_version)."
    echo "# Regenerate with: bash scripts/freeze-constraints.sh $flwr_version $output"
    echo "torch==2.13.0"
    "$venv/bin/pip" freeze --exclude-editable | grep -v '^torch=='
} >"$output"
