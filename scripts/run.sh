#!/usr/bin/env bash
# The main job: set up .venv, then compare clustered sampling (Algorithm 2) with
# its uniform baseline, MD sampling, each through a real `flwr run` on offline
# digits with one class per client (simulations/presets/main.toml says why this
# pair), and print the table and the plot's path. With arguments, they go to the
# launcher instead, e.g. --run-config simulations/presets/X.toml (one run) or
# --compare fedavg,ocs --run-config simulations/presets/ocs-digits-lognormal.toml
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-env.sh
if [ "$#" -eq 0 ]; then
    set -- --compare md,clustered --run-config simulations/presets/main.toml
fi
exec .venv/bin/python -m flwr_importance.tooling.launcher "$@"
