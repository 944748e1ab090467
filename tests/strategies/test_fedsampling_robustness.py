"""Misbehaving nodes, churn, and the size-weighted baseline's draws."""

from __future__ import annotations

import math

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from flwr_importance.clientapps.fedsampling import (
    make_fedsampling_train_handler,
    make_size_query_handler,
)
from flwr_importance.protocol import (
    FEDSAMPLING_SIZE_RESPONSE,
)
from flwr_importance.strategies import MDSampling
from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.fedsampling import FedSampling
from flwr_importance.tooling.testing import InProcessGrid
from simulations.client_app import app as simulation_client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.task import federated_data, global_model, local_task

NUM_NODES = 8


def run_config(strategy: str) -> dict[str, bool | int | float | str]:
    return resolve_run_config(
        {
            "strategy": strategy,
            "dataset": "digits",
            "partitioning": "lognormal",
            "model": "logreg",
        }
    )


def initial_arrays() -> ArrayRecord:
    config = ExperimentConfig.from_run_config(run_config("fedsampling"))
    model = global_model(config, federated_data(config, NUM_NODES))
    return ArrayRecord(model.state_dict())


def misbehaving_app() -> ClientApp:
    """Partition 0 replies an impossible size; partition 1 a NaN gradient."""
    size_query = make_size_query_handler(local_task)
    train = make_fedsampling_train_handler(local_task)

    def query(message: Message, context: Context) -> Message:
        if context.node_config["partition-id"] == 0:
            content = RecordDict(
                {"metrics": MetricRecord({FEDSAMPLING_SIZE_RESPONSE: 5000})}
            )
            return Message(content, reply_to=message)
        return size_query(message, context)

    def nan_train(message: Message, context: Context) -> Message:
        reply = train(message, context)
        if context.node_config["partition-id"] == 1:
            arrays = reply.content.array_records["arrays"]
            poisoned = [np.full_like(a, np.nan) for a in arrays.to_numpy_ndarrays()]
            reply.content["arrays"] = ArrayRecord(poisoned)
        return reply

    app = ClientApp()
    app.query("sizes")(query)
    app.train()(nan_train)
    return app


def test_bad_silent_and_departed_nodes_never_spoil_the_model() -> None:
    grid = InProcessGrid(misbehaving_app(), NUM_NODES, run_config("fedsampling"))
    nodes = list(grid.get_node_ids())
    partition = {grid.partition_of(node): node for node in nodes}
    grid.set_responsive(partition[2], False)
    strategy = FedSampling(samples_per_round=16, server_lr=0.1, min_available_nodes=1)
    arrays = initial_arrays()
    for server_round in (1, 2):
        messages = list(
            strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
        )
        # Partition 0 (bad size) and 2 (silent) get no train message.
        assert {m.metadata.dst_node_id for m in messages} == set(
            grid.get_node_ids()
        ) - {partition[0], partition[2]}
        new_arrays, metrics = strategy.aggregate_train(
            server_round, grid.send_and_receive(messages)
        )
        assert new_arrays is not None and metrics is not None
        assert np.all(np.isfinite(flatten(new_arrays)))
        assert metrics["num-updates"] == metrics["num-size-replies"] - 1  # NaN one
        arrays = new_arrays
        grid.remove_node(partition[3 + server_round])
    assert metrics["num-size-replies"] == NUM_NODES - 3


def test_no_size_reply_skips_the_round() -> None:
    grid = InProcessGrid(simulation_client_app, 3, run_config("fedsampling"))
    for node in grid.get_node_ids():
        grid.set_responsive(node, False)
    strategy = FedSampling(samples_per_round=16, min_available_nodes=1)
    assert (
        list(strategy.configure_train(1, initial_arrays(), ConfigRecord(), grid)) == []
    )
    assert strategy.aggregate_train(1, []) == (None, None)


def test_size_weighted_draws_follow_true_sizes_and_track_churn() -> None:
    grid = InProcessGrid(simulation_client_app, NUM_NODES, run_config("sizeweighted"))
    config = ExperimentConfig.from_run_config(run_config("sizeweighted"))
    sizes = federated_data(config, NUM_NODES).partition_sizes
    strategy = MDSampling(clients_per_round=3, seed=0, min_available_nodes=1)
    arrays, rounds = initial_arrays(), 300
    selected = dict.fromkeys(grid.get_node_ids(), 0)
    for server_round in range(1, rounds + 1):
        for message in strategy.configure_train(
            server_round, arrays, ConfigRecord(), grid
        ):
            selected[message.metadata.dst_node_id] += 1
    # A node is selected when drawn at least once in 3 draws.
    shares = sizes / sizes.sum()
    for node, count in selected.items():
        p = 1 - (1 - shares[grid.partition_of(node)]) ** 3
        assert abs(count / rounds - p) < 4 * math.sqrt(p * (1 - p) / rounds) + 1e-9
    queries = [r for r in grid.wire_log if r.message_type == "query.sizes"]
    assert len(queries) == 2 * NUM_NODES  # one query and one reply per node, once
    departed = next(iter(selected))
    grid.remove_node(departed)
    newcomer = grid.add_node(0, NUM_NODES)
    for server_round in range(rounds + 1, rounds + 30):
        messages = list(
            strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
        )
        assert departed not in {m.metadata.dst_node_id for m in messages}
    assert [r.node_id for r in grid.wire_log if r.message_type == "query.sizes"][
        -2:
    ] == [newcomer, newcomer]
