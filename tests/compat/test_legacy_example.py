"""The legacy example's ServerApp: FedSampling settings that work, and its outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomllib
from flwr.common import parameters_to_ndarrays

from flwr_importance import compat

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "legacy"
NUM_CLIENTS = 10


@pytest.fixture
def server_app(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The example's ``legacy_app.server_app``, importable as under ``flwr run``."""
    monkeypatch.syspath_prepend(str(EXAMPLE_DIR))
    from legacy_app import server_app

    return server_app


def run_config(**overrides: Any) -> dict[str, Any]:
    """The example's default run config with ``overrides``."""
    pyproject = tomllib.loads((EXAMPLE_DIR / "pyproject.toml").read_text())
    config = dict(pyproject["tool"]["flwr"]["app"]["config"])
    config.update(overrides)
    return config


def test_default_fedsampling_settings_are_accepted(server_app: Any) -> None:
    strategy = server_app.build_strategy(
        run_config(strategy="fedsampling"), NUM_CLIENTS
    )
    assert isinstance(strategy, compat.FedSampling)


def test_fedsampling_with_the_papers_epsilon_on_ten_nodes_is_refused(
    server_app: Any,
) -> None:
    config = run_config(strategy="fedsampling", **{"fedsampling-epsilon": 3.0})
    with pytest.raises(ValueError, match="size estimate is noise on 10 nodes") as err:
        server_app.build_strategy(config, NUM_CLIENTS)
    assert "set fedsampling-epsilon >=" in str(err.value)


def test_fedsampling_with_max_size_below_the_partitions_is_refused(
    server_app: Any,
) -> None:
    config = run_config(strategy="fedsampling", **{"fedsampling-max-size": 100})
    with pytest.raises(ValueError, match="must exceed the largest partition"):
        server_app.build_strategy(config, NUM_CLIENTS)


def test_central_evaluation_writes_history_and_plot(
    server_app: Any, tmp_path: Path
) -> None:
    config = run_config(**{"output-dir": str(tmp_path), "num-server-rounds": 1})
    strategy = server_app.build_strategy(config, NUM_CLIENTS)
    weights = [array.copy() for array in _weights(strategy)]
    for server_round in (0, 1):
        strategy.evaluate_fn(server_round, weights, {})
    rows = json.loads((tmp_path / "history.json").read_text())
    assert [row["round"] for row in rows] == [0, 1]
    assert {"loss", "accuracy"} <= set(rows[0])
    assert (tmp_path / "convergence.png").stat().st_size > 0


def _weights(strategy: compat.LegacyStrategyAdapter) -> list[Any]:
    assert strategy.initial_parameters is not None
    return parameters_to_ndarrays(strategy.initial_parameters)
