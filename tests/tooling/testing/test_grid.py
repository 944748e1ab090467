"""The in-process Grid behaves like a SuperLink for the strategies."""

from __future__ import annotations

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
from flwr.common.constant import ErrorCode
from flwr.serverapp.strategy import FedAvg

from flwr_importance.tooling.testing import InProcessGrid

app = ClientApp()


@app.train()
def add_partition_id(message: Message, context: Context) -> Message:
    """Return the model plus the partition id; count calls in the node state."""
    weights = message.content["arrays"].to_numpy_ndarrays()[0]
    partition_id = int(context.node_config["partition-id"])
    if context.run_config.get("fail-partition") == partition_id:
        raise RuntimeError("boom")
    seen = context.state.metric_records.get("seen", MetricRecord({"count": 0}))
    seen["count"] = int(seen["count"]) + 1
    context.state["seen"] = seen
    content = RecordDict(
        {
            "arrays": ArrayRecord([weights + partition_id]),
            "metrics": MetricRecord({"num-examples": 1}),
        }
    )
    return Message(content, reply_to=message)


def train_once(grid: InProcessGrid) -> list[Message]:
    strategy = FedAvg(fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=1)
    messages = strategy.configure_train(
        1, ArrayRecord([np.zeros(2)]), ConfigRecord(), grid
    )
    return list(grid.send_and_receive(messages))


def test_fedavg_runs_on_the_grid_and_averages_replies() -> None:
    grid = InProcessGrid(app, num_nodes=5)
    result = FedAvg(fraction_evaluate=0.0).start(
        grid=grid, initial_arrays=ArrayRecord([np.zeros(2)]), num_rounds=2
    )
    # Each round adds the mean partition id (0+1+2+3+4)/5 = 2.
    np.testing.assert_allclose(result.arrays.to_numpy_ndarrays()[0], [4.0, 4.0])


def test_node_state_persists_across_rounds() -> None:
    grid = InProcessGrid(app, num_nodes=3)
    train_once(grid)
    train_once(grid)
    for node_id in grid.get_node_ids():
        assert grid.node_state(node_id)["seen"]["count"] == 2


def test_replies_come_from_their_nodes_and_cross_the_wire() -> None:
    grid = InProcessGrid(app, num_nodes=4)
    replies = train_once(grid)
    assert {reply.metadata.src_node_id for reply in replies} == set(grid.get_node_ids())
    for reply in replies:
        partition = grid.partition_of(reply.metadata.src_node_id)
        np.testing.assert_allclose(
            reply.content["arrays"].to_numpy_ndarrays()[0], [partition] * 2
        )
    directions = [record.direction for record in grid.wire_log]
    assert directions.count("to-node") == directions.count("to-server") == 4
    assert grid.wire_log[-1].message().metadata.message_type == "train"


def test_failures_become_error_replies_or_missing_replies() -> None:
    grid = InProcessGrid(app, num_nodes=4, run_config={"fail-partition": 1})
    node_ids = list(grid.get_node_ids())
    grid.set_responsive(node_ids[2], False)
    replies = train_once(grid)
    assert len(replies) == 3  # the unresponsive node never answers
    errors = [reply for reply in replies if reply.has_error()]
    assert len(errors) == 1
    assert errors[0].error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert "boom" in errors[0].error.reason


def test_removed_node_gives_node_unavailable() -> None:
    grid = InProcessGrid(app, num_nodes=3)
    node_id = next(iter(grid.get_node_ids()))
    message = Message(
        RecordDict({"arrays": ArrayRecord([np.zeros(2)])}), node_id, "train"
    )
    grid.remove_node(node_id)
    (reply,) = grid.send_and_receive([message])
    assert reply.error.code == ErrorCode.NODE_UNAVAILABLE
    assert node_id not in grid.get_node_ids()


@pytest.mark.parametrize("seed", [0, 1])
def test_node_ids_are_seeded(seed: int) -> None:
    first = list(InProcessGrid(app, num_nodes=3, seed=seed).get_node_ids())
    second = list(InProcessGrid(app, num_nodes=3, seed=seed).get_node_ids())
    assert first == second
