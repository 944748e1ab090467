"""Size-query methods (clustered, MD and any like them) on the user's own ClientApp.

The quickstart-shaped app keeps its train and evaluate functions and gains one
``add_size_query`` line; the real strategies run through the in-process grid.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict, UserConfig
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Strategy

from flwr_importance.clientapps.sizes import (
    add_size_query,
    checked_sample_count,
    sample_count_source,
)
from flwr_importance.registry import MethodSpec, methods
from flwr_importance.tooling.declarations import CannedSetup
from flwr_importance.tooling.testing import InProcessGrid
from flwr_importance.tooling.testing.grid import partition_node_config
from simulations.tooling import declaration
from tests.clientapps.quickstart_user import (
    CUDA,
    LR,
    TRAIN_CALLS,
    assert_trained,
    initial_arrays,
    partition_size,
    run_rounds,
    user_evaluate,
    user_train,
)

NUM_NODES = 6

SETUP = CannedSetup(clients_per_round=3, total_size=600, max_size=100, projection_dim=8)


def size_only(spec: MethodSpec) -> bool:
    """Whether the method's clients train as FedAvg's and answer ``query.sizes``."""
    replies = declaration(spec.name).canned[0].replies
    return set(replies) == {"query.sizes", "train"} and replies["train"] == "model"


def evaluating(spec: MethodSpec) -> Callable[[], Strategy]:
    """The method's first canned configuration, evaluating on every node."""
    arguments = {
        **declaration(spec.name).canned[0].arguments(SETUP),
        "fraction_evaluate": 1.0,
        "min_evaluate_nodes": 1,
    }
    return lambda: spec.build(**arguments)


#: Every method whose clients only add the size query (clustered and MD).
STRATEGIES: dict[str, Callable[[], Strategy]] = {
    spec.name: evaluating(spec) for spec in methods() if size_only(spec)
}


def user_app(**size_source: object) -> ClientApp:
    """The quickstart app plus the one size-query line."""
    app = ClientApp()
    app.train()(user_train)
    app.evaluate()(user_evaluate)
    add_size_query(app, **size_source)  # type: ignore[arg-type]
    return app


def by_callable() -> ClientApp:
    return user_app(
        num_examples=lambda context: partition_size(
            int(context.node_config["partition-id"])
        )
    )


def with_size_in_node_config(partition_id: int, num_partitions: int) -> UserConfig:
    """What ``flower-supernode --node-config "num-examples=..."`` gives."""
    return {
        **partition_node_config(partition_id, num_partitions),
        "num-examples": partition_size(partition_id),
    }


def size_replies(grid: InProcessGrid) -> dict[int, object]:
    replies = [
        record
        for record in grid.wire_log
        if record.message_type == "query.sizes" and record.direction == "to-server"
    ]
    return {
        record.node_id: record.message().content.metric_records["metrics"][
            "num-examples"
        ]
        for record in replies
    }


def run(strategy_name: str, grid: InProcessGrid) -> None:
    TRAIN_CALLS.clear()
    arrays = initial_arrays()
    result = run_rounds(STRATEGIES[strategy_name](), grid, arrays)
    assert size_replies(grid) == {
        node_id: partition_size(grid.partition_of(node_id))
        for node_id in grid.get_node_ids()
    }
    assert_trained(result, arrays)
    assert TRAIN_CALLS and {call.lr for call in TRAIN_CALLS} == {LR}


@pytest.mark.parametrize("strategy_name", sorted(STRATEGIES))
def test_the_size_query_answers_from_the_users_callable(strategy_name: str) -> None:
    run(strategy_name, InProcessGrid(by_callable(), NUM_NODES, {}, seed=5))


@pytest.mark.parametrize("strategy_name", sorted(STRATEGIES))
def test_the_size_query_answers_from_the_node_config(strategy_name: str) -> None:
    app = user_app(node_config_key="num-examples")
    grid = InProcessGrid(
        app, NUM_NODES, {}, seed=6, node_config=with_size_in_node_config
    )
    run(strategy_name, grid)


@CUDA
def test_clustered_runs_the_users_code_on_cuda() -> None:
    run("clustered", InProcessGrid(by_callable(), NUM_NODES, {"device": "cuda"}))
    assert {call.device.split(":")[0] for call in TRAIN_CALLS} == {"cuda"}


def test_a_bad_size_is_an_error_reply_with_the_reason() -> None:
    grid = InProcessGrid(user_app(num_examples=lambda context: -3), 1, {}, seed=0)
    (node_id,) = grid.get_node_ids()
    query = Message(
        RecordDict({"config": ConfigRecord({"server-round": 1})}),
        node_id,
        "query.sizes",
    )
    (reply,) = grid.send_and_receive([query])
    assert reply.has_error()
    assert "num_examples gave -3" in str(reply.error.reason)


def test_a_missing_node_config_key_is_named() -> None:
    count = sample_count_source(node_config_key="num-examples")
    context = Context(0, 1, {"partition-id": 0}, RecordDict(), {})
    with pytest.raises(ValueError, match="node config lacks 'num-examples'"):
        count(context)


def test_exactly_one_size_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        sample_count_source()
    with pytest.raises(ValueError, match="exactly one"):
        sample_count_source(num_examples=lambda context: 1, node_config_key="n")


@pytest.mark.parametrize("value", [True, 2.5, -1, float("nan"), "12", None])
def test_only_whole_nonnegative_numbers_are_sizes(value: object) -> None:
    with pytest.raises(ValueError, match="not a sample count"):
        checked_sample_count(value, source="num_examples")
