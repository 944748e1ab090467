"""A client side that raises on every node stops the quickstarts' run in round 1.

The docs' size lines once called ``load_data(partition_id, num_partitions)``
while Flower's app's ``load_data`` also takes ``batch_size``: every node's
handler raised, every round dropped every reply, and the run ended as if it
had trained. Here the examples' own ``load_data`` is swapped for one whose
arguments do not match the calls (the same ``TypeError`` on every node), and
the run must stop in round 1 with that exception quoted: the Message-API
quickstart on an in-process grid, the legacy (``NumPyClient``) quickstart in
Flower's legacy server loop.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import tomllib
from flwr.app import Context, RecordDict

from flwr_importance import compat
from flwr_importance.strategies import ClientSideFailedError
from flwr_importance.tooling.testing import InProcessGrid
from tests.clientapps.test_numpy_client import EXAMPLE_DIR as LEGACY_DIR
from tests.compat.compat_harness import run_legacy
from tests.e2e.examples.test_examples import (
    QUICKSTART_NODES,
    quickstart_defaults,
    quickstart_module,
)
from tests.examples.test_legacy import client_manager

#: What Python says when a two-argument ``load_data`` gets Flower's three.
MESSAGE_API_ERROR = "takes 2 positional arguments but 3 were given"
#: What Python says when a three-argument ``load_data`` gets two.
LEGACY_ERROR = "missing 1 required positional argument: 'batch_size'"


def load_data_of_two(partition_id: int, num_partitions: int) -> Any:
    raise AssertionError("never called: the arguments do not match")


def load_data_of_three(partition_id: int, num_partitions: int, batch_size: int) -> Any:
    raise AssertionError("never called: the arguments do not match")


def test_message_api_quickstart_stops_in_round_1_quoting_the_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server_app = quickstart_module("server_app")
    client_app = quickstart_module("client_app")
    monkeypatch.setattr(client_app, "load_data", load_data_of_two)
    run_config = {**quickstart_defaults(), "strategy": "md", "num-server-rounds": 3}
    grid = InProcessGrid(client_app.app, QUICKSTART_NODES, run_config, seed=0)
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    with (
        caplog.at_level(logging.INFO),
        pytest.raises(ClientSideFailedError, match=MESSAGE_API_ERROR) as raised,
    ):
        server_app.main(grid, context)
    assert "add_size_query" in str(raised.value)  # the lines that fix it
    assert "[ROUND 1/3]" in caplog.text and "[ROUND 2/3]" not in caplog.text


def test_legacy_quickstart_stops_in_round_1_quoting_the_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.syspath_prepend(str(LEGACY_DIR))
    from quickstart_legacy import client_app, server_app

    monkeypatch.setattr(client_app, "load_data", load_data_of_three)
    with (LEGACY_DIR / "pyproject.toml").open("rb") as file:
        run_config = dict(tomllib.load(file)["tool"]["flwr"]["app"]["config"])
    run_config.update(strategy="md", **{"num-server-rounds": 3})
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    components = server_app.server_fn(context)
    fits: list[int] = []
    strategy = components.strategy
    configure_fit = strategy.configure_fit

    def counted(server_round: int, *args: Any, **kwargs: Any) -> Any:
        fits.append(server_round)
        return configure_fit(server_round, *args, **kwargs)

    monkeypatch.setattr(strategy, "configure_fit", counted)
    client_fn = compat.importance_client_fn(
        client_app.client_fn, num_examples=client_app.train_size
    )
    with (
        caplog.at_level(logging.INFO),
        pytest.raises(ClientSideFailedError, match=LEGACY_ERROR) as raised,
    ):
        run_legacy(strategy, client_manager(client_fn, run_config), 3)
    assert "compat.importance_client_fn" in str(raised.value)  # the legacy lines
    assert fits == [1]
    assert "query.sizes: 10 x error reply" in caplog.text  # the summary
