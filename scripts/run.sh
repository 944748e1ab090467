#!/usr/bin/env bash
# The main job: set up .venv, then a real `flwr run` simulation of the default
# experiment (digits, 2 classes per client, 30 virtual SuperNodes). Extra
# arguments go to the launcher, e.g. --run-config simulations/presets/X.toml
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
exec .venv/bin/python -m flwr_importance.launcher "$@"
