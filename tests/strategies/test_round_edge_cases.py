"""Rounds at the edges of the reply contract.

Train replies whose weights all are ``num-examples = 0`` leave the round's
averaged metrics undefined: the round still aggregates, with a warning and
no averaged metrics, instead of ending the run. FOLB with a custom
``weighted_by_key`` still weighs by ``num-examples``, so a reply without it
is dropped by name. MMFL's size query carries ``server-round`` like every
other message.
"""

from __future__ import annotations

import logging

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

from flwr_importance.protocol import (
    FOLB_FALLBACK,
    FOLB_GAMMA,
    FOLB_GRADIENT,
    FOLB_UPDATE,
    ISFEDAVG_GRADIENT_SQ_NORM,
    ISFEDAVG_SIGMA2,
    NUM_EXAMPLES,
    NUM_MODELS,
    SERVER_ROUND,
    SIZES_QUERY,
    query_message_type,
)
from flwr_importance.strategies import FOLB, ISFedAvg, MultiModelSampling, pack_models
from flwr_importance.strategies.arrays import flatten
from flwr_importance.tooling.testing import InProcessGrid
from tests.strategies.test_base import RecordingGrid
from tests.strategies.test_server_warnings import MODEL
from tests.strategies.test_server_warnings import app as query_app

NUM_NODES = 4
#: What each node's train reply sends, by partition, in the crafted apps.
TRAINED = ArrayRecord([np.ones(3, np.float32)])


def partition(context: Context) -> int:
    return int(context.node_config["partition-id"])


def isfedavg_app(num_examples: int) -> ClientApp:
    """ISFedAvg's train reply: the model ``TRAINED`` and the statistics."""
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        metrics = {
            ISFEDAVG_SIGMA2: 1.0,
            ISFEDAVG_GRADIENT_SQ_NORM: 1.0,
            NUM_EXAMPLES: num_examples,
        }
        content = RecordDict({"arrays": TRAINED, "metrics": MetricRecord(metrics)})
        return Message(content, reply_to=message)

    return app


def folb_app(metrics_of: dict[int, dict[str, float]]) -> ClientApp:
    """FOLB's train reply: an update, a gradient and partition ``k``'s metrics."""
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        k = partition(context)
        content = RecordDict(
            {
                FOLB_UPDATE: ArrayRecord([np.full(3, 0.1 * (k + 1), np.float32)]),
                FOLB_GRADIENT: ArrayRecord([np.array([1.0, 0.5, k], np.float32)]),
                "metrics": MetricRecord({FOLB_GAMMA: 0.5, **metrics_of[k]}),
            }
        )
        return Message(content, reply_to=message)

    return app


def test_isfedavg_round_of_zero_weights_aggregates_without_metrics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    grid = InProcessGrid(isfedavg_app(num_examples=0), NUM_NODES, seed=1)
    strategy = ISFedAvg(clients_per_round=2, fraction_evaluate=0.0, seed=0)
    with caplog.at_level(logging.WARNING):
        result = strategy.start(grid, MODEL, num_rounds=1)
    # eq. 5: the plain mean of the returned models, all of them TRAINED.
    np.testing.assert_array_equal(flatten(result.arrays), flatten(TRAINED))
    assert ISFEDAVG_SIGMA2 not in result.train_metrics_clientapp.get(1, {})
    assert "'num-examples' sum to zero" in caplog.text


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_folb_round_of_zero_weights_keeps_its_own_metrics(
    weighting: str, caplog: pytest.LogCaptureFixture
) -> None:
    zero = {k: {NUM_EXAMPLES: 0.0} for k in range(NUM_NODES)}
    grid = InProcessGrid(folb_app(zero), NUM_NODES, seed=1)
    strategy = FOLB(
        clients_per_round=3,
        weighting=weighting,  # type: ignore[arg-type]
        fraction_evaluate=0.0,
        seed=0,
    )
    with caplog.at_level(logging.WARNING):
        result = strategy.start(grid, MODEL, num_rounds=1)
    assert np.all(np.isfinite(flatten(result.arrays)))
    metrics = result.train_metrics_clientapp[1]
    assert FOLB_FALLBACK in metrics and FOLB_GAMMA not in metrics
    assert "'num-examples' sum to zero" in caplog.text


def test_folb_with_a_custom_weight_key_drops_a_reply_without_num_examples(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics_of = {k: {"weight": 2.0, NUM_EXAMPLES: 10.0} for k in range(NUM_NODES)}
    del metrics_of[0][NUM_EXAMPLES]
    grid = InProcessGrid(folb_app(metrics_of), NUM_NODES, seed=1)
    strategy = FOLB(
        clients_per_round=NUM_NODES,
        replace=False,
        weighted_by_key="weight",
        fraction_evaluate=0.0,
        seed=0,
    )
    messages = list(strategy.configure_train(1, MODEL, ConfigRecord(), grid))
    replies = list(grid.send_and_receive(messages))
    lacking = next(
        reply.metadata.src_node_id
        for reply in replies
        if grid.partition_of(reply.metadata.src_node_id) == 0
    )
    with caplog.at_level(logging.WARNING):
        arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is not None and metrics is not None
    assert f"node {lacking} excluded" in caplog.text
    assert NUM_EXAMPLES in caplog.text
    # The other three replies make the round (their metrics averaged).
    assert metrics[NUM_EXAMPLES] == 10.0


def test_mmfl_size_query_carries_the_server_round() -> None:
    grid = RecordingGrid(query_app, num_nodes=NUM_NODES)
    strategy = MultiModelSampling(
        num_models=1, clients_per_round=2, variant="random", seed=0
    )
    list(strategy.configure_train(3, pack_models([MODEL]), ConfigRecord(), grid))
    queries = [
        message
        for message in grid.sent
        if message.metadata.message_type == query_message_type(SIZES_QUERY)
    ]
    assert len(queries) == NUM_NODES
    for message in queries:
        config = message.content.config_records["config"]
        assert config[SERVER_ROUND] == 3
        assert config[NUM_MODELS] == 1
