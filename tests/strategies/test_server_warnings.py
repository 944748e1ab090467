"""Loud where a run would otherwise silently not be the method it names.

Fewer connected nodes than ``clients_per_round`` turns every sampling method
into full participation (or repeated draws): each round says so, naming both
numbers. Federated evaluation switched off on purpose is not a failure and
logs nothing; asked for and without a usable reply, it warns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Strategy

from flwr_importance.protocol import (
    FEDSAMPLING_SIZE_RESPONSE,
    LOSS,
    NUM_EXAMPLES,
    UPDATE_NORM,
    per_model_key,
)
from flwr_importance.registry import MethodSpec, methods
from flwr_importance.strategies import MDSampling, pack_models
from flwr_importance.tooling.declarations import CannedSetup
from flwr_importance.tooling.testing import InProcessGrid
from simulations.tooling import declaration

MODEL = ArrayRecord([np.zeros(3, np.float32)])

#: Answers every query a strategy sends from configure_train, for one model.
app = ClientApp()


@app.query("sizes")
@app.query("norm")
@app.query("loss")
def answer_query(message: Message, context: Context) -> Message:
    """Ten samples (FedSampling's size reply too), update norm 1, loss 1 (model 0)."""
    metrics = MetricRecord(
        {
            NUM_EXAMPLES: 10,
            FEDSAMPLING_SIZE_RESPONSE: 10,
            per_model_key(NUM_EXAMPLES, 0): 10,
            per_model_key(UPDATE_NORM, 0): 1.0,
            per_model_key(LOSS, 0): 1.0,
        }
    )
    return Message(RecordDict({"metrics": metrics}), reply_to=message)


CLIENTS_PER_ROUND = 5
SETUP = CannedSetup(
    clients_per_round=CLIENTS_PER_ROUND, total_size=100, max_size=100, projection_dim=3
)


def sampling_strategy(spec: MethodSpec) -> Callable[[], Strategy]:
    """The method's first canned configuration (FOLB: without replacement)."""
    arguments = declaration(spec.name).canned[0].arguments(SETUP)
    return lambda: spec.build(**arguments)


#: Every method that samples ``clients_per_round = 5`` clients, and its model.
STRATEGIES: dict[str, tuple[Callable[[], Strategy], ArrayRecord]] = {
    spec.name: (
        sampling_strategy(spec),
        pack_models([MODEL])
        if declaration(spec.name).canned[0].packed_models
        else MODEL,
    )
    for spec in methods()
    if spec.clients_per_round
}


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_fewer_nodes_than_clients_per_round_warn_every_round(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    build, arrays = STRATEGIES[name]
    strategy = build()
    grid = InProcessGrid(app, num_nodes=3)
    with caplog.at_level(logging.WARNING):
        for server_round in (1, 2):
            strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
    warning = "3 nodes connected, fewer than clients_per_round=5"
    assert caplog.text.count(warning) == 2, caplog.text
    assert "start more nodes or lower clients_per_round" in caplog.text


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_enough_nodes_do_not_warn(name: str, caplog: pytest.LogCaptureFixture) -> None:
    build, arrays = STRATEGIES[name]
    grid = InProcessGrid(app, num_nodes=5)
    with caplog.at_level(logging.WARNING):
        build().configure_train(1, arrays, ConfigRecord(), grid)
    assert "fewer than clients_per_round" not in caplog.text


def test_evaluation_off_on_purpose_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = MDSampling(clients_per_round=2, fraction_evaluate=0.0)
    with caplog.at_level(logging.INFO):
        assert strategy.aggregate_evaluate(1, []) is None
    assert "aggregate_evaluate" not in caplog.text


def test_evaluation_asked_for_without_a_usable_reply_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = MDSampling(clients_per_round=2, fraction_evaluate=0.5)
    with caplog.at_level(logging.WARNING):
        assert strategy.aggregate_evaluate(1, []) is None
    assert "no usable reply with a positive weight" in caplog.text
