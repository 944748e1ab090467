"""Run the simulation app in this process, on the in-process grid.

Same ServerApp code, same ClientApp, same messages as ``flwr run``, without a
SuperLink or Ray: what tests and benchmarks use for many seeded runs.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from flwr_importance.tooling.testing import InProcessGrid
from simulations.client_app import app as client_app
from simulations.config import ExperimentConfig, RunConfig
from simulations.report import HistoryRow
from simulations.server_app import run_experiment

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

APP_DIR = Path(__file__).resolve().parent.parent
PRESETS_DIR = Path(__file__).resolve().parent / "presets"


def default_run_config() -> dict[str, bool | int | float | str]:
    """The ``[tool.flwr.app.config]`` table of the app's ``pyproject.toml``."""
    with (APP_DIR / "pyproject.toml").open("rb") as file:
        return dict(tomllib.load(file)["tool"]["flwr"]["app"]["config"])


def load_preset(name: str) -> dict[str, bool | int | float | str]:
    """The overrides in ``simulations/presets/<name>.toml``."""
    with (PRESETS_DIR / f"{name}.toml").open("rb") as file:
        return dict(tomllib.load(file))


def resolve_run_config(overrides: RunConfig) -> dict[str, bool | int | float | str]:
    """Defaults with ``overrides`` applied; unknown keys are rejected as by Flower."""
    run_config = default_run_config()
    unknown = set(overrides) - set(run_config)
    if unknown:
        raise ValueError(f"keys not in [tool.flwr.app.config]: {sorted(unknown)}")
    run_config.update(overrides)
    return run_config


def run_inprocess(
    overrides: Mapping[str, bool | int | float | str], num_clients: int | None = None
) -> tuple[list[HistoryRow], InProcessGrid]:
    """Run the app with ``overrides`` on ``num_clients`` in-process nodes.

    ``num_clients`` defaults to the run config's ``num-supernodes`` and, when
    given, replaces it, as ``--num-supernodes`` does for the launcher.

    Returns
    -------
    tuple
        The history rows and the grid (for its ``wire_log`` and node states).
    """
    run_config = resolve_run_config(overrides)
    if num_clients is None:
        num_clients = int(run_config["num-supernodes"])
    run_config["num-supernodes"] = num_clients
    grid = InProcessGrid(
        client_app, num_clients, run_config, seed=int(run_config["seed"])
    )
    config = ExperimentConfig.from_run_config(run_config)
    return run_experiment(grid, config, num_clients=num_clients), grid
