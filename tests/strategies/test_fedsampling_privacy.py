"""FedSampling's privacy contract, checked on the wire.

Every message of a run is captured as the protobuf it would be on the wire
(``InProcessGrid.wire_log``). No reply may carry a field equal to the node's
true size or to the number of samples it kept that round; the randomized size
reply may equal the true size only as often as randomized response allows.
Each check is also run on a leaky ClientApp, to show it catches the leak.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_importance.clientapps import ClientHandler
from flwr_importance.clientapps.fedsampling import (
    make_fedsampling_train_handler,
    make_size_query_handler,
    node_round_streams,
)
from flwr_importance.protocol import (
    FEDSAMPLING_NODE_ANSWERS,
    FEDSAMPLING_NODE_EPSILON,
    FEDSAMPLING_NODE_REPRODUCIBLE_COINS,
    FEDSAMPLING_SIZE_RESPONSE,
)
from flwr_importance.sampling.fedsampling import bernoulli_keep, keep_probability
from flwr_importance.sampling.privacy import ldp_alpha
from flwr_importance.strategies.fedsampling import FedSampling
from flwr_importance.tooling.testing import InProcessGrid
from simulations.client_app import app as simulation_client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.task import federated_data, global_model, local_task

NUM_NODES, ROUNDS, MAX_SIZE, EPSILON = 40, 4, 100, 3.0
#: The node's own ledger in its size reply: how many queries it answered, their
#: epsilon and its coins' kind, all functions of what the server asked.
NODE_LEDGER_KEYS = (
    FEDSAMPLING_NODE_ANSWERS,
    FEDSAMPLING_NODE_EPSILON,
    FEDSAMPLING_NODE_REPRODUCIBLE_COINS,
)
RUN_CONFIG = resolve_run_config(
    {
        "strategy": "fedsampling",
        "dataset": "digits",
        "partitioning": "lognormal",
        "lognormal-sigma": 1.0,
        "model": "logreg",
        # The check replays each node's keep coins to know |S_c|: the
        # reproducible streams (test_ldp_coins_attack.py shows the default
        # coins cannot be replayed).
        "fedsampling-unsafe-reproducible-coins": True,
    }
)


def run_fedsampling(client_app: ClientApp) -> InProcessGrid:
    config = ExperimentConfig.from_run_config(RUN_CONFIG)
    model = global_model(config, federated_data(config, NUM_NODES))
    grid = InProcessGrid(client_app, NUM_NODES, RUN_CONFIG, seed=3)
    strategy = FedSampling(
        samples_per_round=32,
        max_size=MAX_SIZE,
        epsilon=EPSILON,
        server_lr=0.1,
        min_available_nodes=1,
    )
    strategy.start(
        grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=ROUNDS
    )
    return grid


def node_context(grid: InProcessGrid, node_id: int) -> Context:
    node_config = {
        "partition-id": grid.partition_of(node_id),
        "num-partitions": NUM_NODES,
    }
    return Context(0, node_id, node_config, RecordDict(), RUN_CONFIG)


def exchanges(grid: InProcessGrid) -> Iterator[tuple[Message, Message]]:
    """(request, reply) pairs: the in-process grid delivers one at a time."""
    for request, reply in itertools.pairwise(grid.wire_log):
        if request.direction == "to-node" and reply.direction == "to-server":
            assert request.node_id == reply.node_id
            yield request.message(), reply.message()


def kept_count(grid: InProcessGrid, node_id: int, request: Message) -> int:
    """``|S_c|`` as the node drew it (its round's keep stream)."""
    config = request.content.config_records["config"]
    task = local_task(node_context(grid, node_id))
    keep_rng, _ = node_round_streams(task.seed, int(config["server-round"]))
    probability = keep_probability(
        int(config["samples-per-round"]), float(config["estimated-total-size"])
    )
    return int(bernoulli_keep(len(task.x), probability, keep_rng).sum())


def scalar_fields(message: Message) -> Iterator[tuple[str, float]]:
    """Every number in the message's metric and config records."""
    records = {**message.content.metric_records, **message.content.config_records}
    for record in records.values():
        for key, value in record.items():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, (int, float)):
                    yield key, float(item)


def leaks(grid: InProcessGrid) -> list[str]:
    """Reply fields equal to the node's true size or kept count."""
    found = []
    for request, reply in exchanges(grid):
        node_id = reply.metadata.src_node_id
        true_size = len(local_task(node_context(grid, node_id)).x)
        secrets = {"true size": true_size}
        if reply.metadata.message_type == "train":
            secrets["kept count"] = kept_count(grid, node_id, request)
            model_keys = list(request.content.array_records["arrays"].keys())
            if [list(r.keys()) for r in reply.content.array_records.values()] != [
                model_keys
            ]:
                found.append(f"node {node_id}: extra arrays in the train reply")
        for key, value in scalar_fields(reply):
            if key == FEDSAMPLING_SIZE_RESPONSE:
                continue  # randomized response: see the statistical test
            if key in NODE_LEDGER_KEYS:
                continue  # counts of the server's own queries, no data
            found += [
                f"node {node_id}: '{key}' = {name} {value:g}"
                for name, secret in secrets.items()
                if value == secret
            ]
    return found


def truthful_fraction(grid: InProcessGrid) -> tuple[float, int]:
    """How often the size reply equals the node's clipped true size."""
    hits = []
    for _, reply in exchanges(grid):
        if reply.metadata.message_type == "query.sizes":
            task = local_task(node_context(grid, reply.metadata.src_node_id))
            clipped = min(max(len(task.x), 1), MAX_SIZE - 1)
            response = reply.content.metric_records["metrics"][
                FEDSAMPLING_SIZE_RESPONSE
            ]
            hits.append(response == clipped)
    return float(np.mean(hits)), len(hits)


def assert_randomized(fraction: float, count: int) -> None:
    # P(reply = true size) = alpha + (1 - alpha)/(M - 1) under randomized response.
    alpha = ldp_alpha(EPSILON, MAX_SIZE)
    expected = alpha + (1 - alpha) / (MAX_SIZE - 1)
    assert abs(fraction - expected) < 4 * math.sqrt(expected * (1 - expected) / count)


def test_no_reply_carries_a_true_size_or_a_kept_count() -> None:
    grid = run_fedsampling(simulation_client_app)
    train_replies = [
        r for _, r in exchanges(grid) if r.metadata.message_type == "train"
    ]
    assert len(train_replies) > 0.9 * NUM_NODES * ROUNDS
    assert leaks(grid) == []
    assert_randomized(*truthful_fraction(grid))


def with_metric(handler: ClientHandler, key: str) -> ClientHandler:
    """A leaky train handler: adds ``key`` = the node's true size to the reply."""

    def leaky(message: Message, context: Context) -> Message:
        reply = handler(message, context)
        size = len(local_task(context).x)
        reply.content["metrics"] = MetricRecord({key: size})
        return reply

    return leaky


def test_the_wire_check_catches_a_num_examples_leak() -> None:
    app = ClientApp()
    app.query("sizes")(make_size_query_handler(local_task))
    app.train()(with_metric(make_fedsampling_train_handler(local_task), "num-examples"))
    found = leaks(run_fedsampling(app))
    assert len(found) >= NUM_NODES * ROUNDS * 0.9
    assert "'num-examples' = true size" in found[0]


def test_the_wire_check_catches_a_truthful_size_reply() -> None:
    def true_size(message: Message, context: Context) -> Message:
        content = RecordDict(
            {
                "metrics": MetricRecord(
                    {FEDSAMPLING_SIZE_RESPONSE: len(local_task(context).x)}
                )
            }
        )
        return Message(content, reply_to=message)

    app = ClientApp()
    app.query("sizes")(true_size)
    app.train()(make_fedsampling_train_handler(local_task))
    fraction, count = truthful_fraction(run_fedsampling(app))
    try:
        assert_randomized(fraction, count)
    except AssertionError:
        return
    raise AssertionError(f"a truthful size reply passed ({fraction:.2f} of {count})")
