"""The legacy example: every method through Flower's legacy server loop, in process.

Also its FedSampling settings that work, and its outputs. The example's own
``build_strategy`` and ``client_fn`` run under Flower's legacy ``Server``
(``configure_fit``/``aggregate_fit``, ``ClientProxy`` calls) with in-process
proxies, for every registry method on the legacy API; ``flwr run`` of the
example itself is ``tests/e2e/examples/test_examples.py``, and the legacy methods with
a query (OCS, AOCS, Power-of-Choice) run under ``flwr run`` in the NumPyClient
quickstart (``tests/e2e/examples/test_legacy_numpyclient_example.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomllib
from flwr.app import Context, RecordDict
from flwr.common import parameters_to_ndarrays
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.server.client_manager import SimpleClientManager
from flwr.supercore.task_identity import TaskIdentity

from flwr_importance import compat
from flwr_importance.registry import methods
from flwr_importance.tooling.testing.grid import partition_node_config
from tests.compat.compat_harness import InProcessClientProxy, run_legacy

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


@pytest.fixture
def client_app(server_app: Any) -> Any:
    """The example's ``legacy_app.client_app`` (its path is on ``sys.path``)."""
    from legacy_app import client_app

    return client_app


def client_manager(client_fn: Any, config: dict[str, Any]) -> SimpleClientManager:
    """``NUM_CLIENTS`` in-process legacy clients, one partition and context each.

    The server's identity is set as Flower's runtime sets it, for the messages
    the Message-API strategy inside the legacy class builds.
    """
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    TaskIdentity.task_id = 1
    manager = SimpleClientManager()
    for partition_id in range(NUM_CLIENTS):
        context = Context(
            run_id=1,
            node_id=partition_id + 1,
            node_config=partition_node_config(partition_id, NUM_CLIENTS),
            state=RecordDict(),
            run_config=config,
        )
        manager.register(InProcessClientProxy(context, client_fn))
    return manager


@pytest.mark.parametrize(
    "strategy_name", [spec.name for spec in methods() if spec.legacy_api]
)
def test_every_legacy_method_trains_in_the_example(
    server_app: Any, client_app: Any, strategy_name: str, tmp_path: Path
) -> None:
    config = run_config(
        strategy=strategy_name, **{"num-server-rounds": 2, "output-dir": str(tmp_path)}
    )
    strategy = server_app.build_strategy(config, NUM_CLIENTS)
    initial = _weights(strategy)
    final = run_legacy(strategy, client_manager(client_app.client_fn, config), 2)
    assert any(
        not np.allclose(before, after)
        for before, after in zip(initial, final, strict=True)
    )
    rows = json.loads((tmp_path / "history.json").read_text())
    assert [row["round"] for row in rows] == [0, 1, 2]


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
