"""The ISFedAvg strategy on the in-process grid: selection, eq. 5, eq. 28, failures.

Statistical checks use fixed seeds and tolerances of ``Z`` standard errors.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)

from flwr_importance.clientapps.isfedavg import (
    SAMPLE_STATE_KEY,
)
from flwr_importance.protocol import (
    ISFEDAVG_ADAPT_SAMPLE_PROBS,
    ISFEDAVG_BATCH_SIZE,
    ISFEDAVG_CLIENT_PROB,
    ISFEDAVG_DIVIDE_BY_LOCAL_STEPS,
    ISFEDAVG_GRADIENT_SQ_NORM,
    ISFEDAVG_LOCAL_STEPS,
    ISFEDAVG_NUM_CLIENTS,
    ISFEDAVG_SIGMA2,
)
from flwr_importance.strategies.isfedavg import ISFedAvg
from flwr_importance.strategies.replies import ClientSideFailedError
from flwr_importance.tooling.testing import InProcessGrid
from simulations.inprocess import load_preset, run_inprocess
from tests.clientapps.test_isfedavg import app as isfedavg_app
from tests.clientapps.test_isfedavg import regression_task
from tests.tooling.testing.test_grid import app as echo_app

#: Standard errors allowed between an empirical frequency and its target.
Z = 4.5

MODEL = ArrayRecord([np.zeros(3, np.float32)])


def configured(
    strategy: ISFedAvg, grid: InProcessGrid, server_round: int = 1
) -> list[Message]:
    """The round's train messages, with message ids so that replies can refer."""
    messages = list(strategy.configure_train(server_round, MODEL, ConfigRecord(), grid))
    for index, message in enumerate(messages):
        message.metadata.__dict__["_message_id"] = f"m{server_round}-{index}"
    return messages


def reply_to(
    message: Message, weights: list[float], sigma2: float, g2: float
) -> Message:
    content = RecordDict(
        {
            "arrays": ArrayRecord([np.array(weights, np.float32)]),
            "metrics": MetricRecord(
                {
                    ISFEDAVG_SIGMA2: sigma2,
                    ISFEDAVG_GRADIENT_SQ_NORM: g2,
                    "num-examples": 10,
                }
            ),
        }
    )
    return Message(content, reply_to=message)


def config_of(message: Message) -> ConfigRecord:
    return message.content.config_records["config"]


def test_selection_frequencies_match_capped_l_p_k() -> None:
    grid = InProcessGrid(echo_app, num_nodes=8)
    strategy = ISFedAvg(clients_per_round=3, seed=3)
    node_ids = strategy.sync_nodes(grid.get_node_ids())
    probs = [0.4, 0.2, 0.1, 0.1, 0.08, 0.06, 0.04, 0.02]
    strategy.client_probs.update(zip(node_ids, probs, strict=True))
    # L p_0 = 1.2 is capped at 1; the other two units go to the remaining 0.6
    # of mass in proportion: L p_k -> p_k * 2 / 0.6.
    expected = np.array([1.0] + [p * 2 / 0.6 for p in probs[1:]])
    rounds = 3000
    counts = dict.fromkeys(node_ids, 0)
    for server_round in range(1, rounds + 1):
        messages = configured(strategy, grid, server_round)
        assert len(messages) == 3
        for message in messages:
            node = message.metadata.dst_node_id
            counts[node] += 1
            config = config_of(message)
            # The realized normalized inclusion probability is what is sent.
            sent = config[ISFEDAVG_CLIENT_PROB]
            assert sent == pytest.approx(expected[node_ids.index(node)] / 3)
            assert config[ISFEDAVG_NUM_CLIENTS] == 8
            assert config[ISFEDAVG_LOCAL_STEPS] == strategy.local_steps[node]
            assert config[ISFEDAVG_BATCH_SIZE] == strategy.batch_sizes[node]
            assert config[ISFEDAVG_ADAPT_SAMPLE_PROBS] is True
            assert config["server-round"] == server_round
    frequencies = np.array([counts[node] for node in node_ids]) / rounds
    tolerance = Z * np.sqrt(expected * (1 - expected) / rounds) + 1e-12
    np.testing.assert_array_less(np.abs(frequencies - expected), tolerance)
    # Configuring does not move the probabilities.
    assert [strategy.client_probs[node] for node in node_ids] == probs


def test_local_steps_and_batch_sizes_are_drawn_once_per_node_in_range() -> None:
    grid = InProcessGrid(echo_app, num_nodes=40)
    strategy = ISFedAvg(
        clients_per_round=4, local_steps_range=(1, 5), batch_size_range=(2, 10)
    )
    configured(strategy, grid)
    steps = dict(strategy.local_steps)
    sizes = dict(strategy.batch_sizes)
    assert set(steps.values()) <= set(range(1, 6)) and len(set(steps.values())) > 1
    assert set(sizes.values()) <= set(range(2, 11)) and len(set(sizes.values())) > 1
    configured(strategy, grid, 2)
    assert strategy.local_steps == steps and strategy.batch_sizes == sizes


def test_eq28_on_crafted_replies_and_the_plain_mean_of_models() -> None:
    grid = InProcessGrid(echo_app, num_nodes=4)
    strategy = ISFedAvg(clients_per_round=2, seed=5, min_relative_client_prob=0.1)
    messages = configured(strategy, grid)
    first, second = (message.metadata.dst_node_id for message in messages)
    before = dict(strategy.client_probs)
    stats = {first: (2.0, 1.0), second: (0.5, 4.0)}
    replies = [
        reply_to(messages[0], [1.0, 2.0, 3.0], *stats[first]),
        reply_to(messages[1], [3.0, 2.0, 1.0], *stats[second]),
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert arrays is not None and metrics is not None
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], [2.0, 2.0, 2.0])

    def importance(node: int) -> float:
        sigma2, g2 = stats[node]
        alpha = 3 + 6 / (strategy.local_steps[node] * strategy.batch_sizes[node])
        return math.sqrt(sigma2 + alpha * g2)

    # The participants keep their total 1/2 and share it by importance; the
    # others keep 1/4 each (the 0.1/4 floor does not bind here).
    total = importance(first) + importance(second)
    assert min(importance(first), importance(second)) / total * 0.5 > 0.1 / 4
    assert strategy.client_probs[first] == pytest.approx(
        0.5 * importance(first) / total
    )
    assert strategy.client_probs[second] == pytest.approx(
        0.5 * importance(second) / total
    )
    for node in set(before) - {first, second}:
        assert strategy.client_probs[node] == pytest.approx(0.25)
    assert sum(strategy.client_probs.values()) == pytest.approx(1.0, abs=1e-12)


def test_bad_and_missing_replies_are_logged_and_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    grid = InProcessGrid(echo_app, num_nodes=10)
    strategy = ISFedAvg(clients_per_round=5, seed=7)
    messages = configured(strategy, grid)
    nodes = [message.metadata.dst_node_id for message in messages]
    before = dict(strategy.client_probs)
    replies = [
        reply_to(messages[0], [1.0, 1.0, 1.0], 1.0, 1.0),
        reply_to(messages[1], [9.0, 9.0, 9.0], math.nan, 1.0),
        reply_to(messages[2], [9.0, 9.0, 9.0], 1.0, -2.0),
        Message(Error(0, "crashed"), reply_to=messages[3]),
        # messages[4] gets no reply at all (a time-out).
    ]
    with caplog.at_level(logging.WARNING):
        arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], [1.0, 1.0, 1.0])
    for node, problem in zip(
        nodes[1:4], ("not a finite number", "negative", "crashed"), strict=True
    ):
        assert f"node {node} excluded: " in caplog.text
        assert problem in caplog.text
    # One participant: eq. 28 gives it its own old share back; nobody moves.
    for node, prob in before.items():
        assert strategy.client_probs[node] == pytest.approx(prob)


def test_a_first_round_without_usable_replies_stops_and_keeps_the_probabilities() -> (
    None
):
    grid = InProcessGrid(echo_app, num_nodes=6)
    strategy = ISFedAvg(clients_per_round=2, seed=1)
    messages = configured(strategy, grid)
    before = dict(strategy.client_probs)
    replies = [reply_to(message, [5.0, 5.0, 5.0], -1.0, 0.0) for message in messages]
    # No node has ever trained well: nothing can train, the run stops.
    with pytest.raises(ClientSideFailedError):
        strategy.aggregate_train(1, replies)
    assert strategy.client_probs == before


def test_a_later_round_without_usable_replies_keeps_the_model_and_probabilities() -> (
    None
):
    grid = InProcessGrid(echo_app, num_nodes=6)
    strategy = ISFedAvg(clients_per_round=2, seed=1)
    # A usable round first: a first round where every reply fails stops the
    # run instead (the client side cannot train, docs/reliability.md).
    messages = configured(strategy, grid)
    strategy.aggregate_train(1, [reply_to(m, [1.0] * 3, 1.0, 1.0) for m in messages])
    messages = configured(strategy, grid, 2)
    before = dict(strategy.client_probs)
    replies = [reply_to(message, [5.0, 5.0, 5.0], -1.0, 0.0) for message in messages]
    assert strategy.aggregate_train(2, replies) == (None, None)
    assert strategy.client_probs == before


def test_replies_from_nodes_not_selected_are_excluded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    grid = InProcessGrid(echo_app, num_nodes=6)
    strategy = ISFedAvg(clients_per_round=2, seed=2)
    messages = configured(strategy, grid)
    stranger = Message(RecordDict(), 424242, "train")
    stranger.metadata.__dict__["_message_id"] = "stranger"
    replies = [
        reply_to(messages[0], [1.0, 1.0, 1.0], 1.0, 1.0),
        reply_to(stranger, [7.0, 7.0, 7.0], 1.0, 1.0),
    ]
    with caplog.at_level(logging.WARNING):
        arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    np.testing.assert_allclose(arrays.to_numpy_ndarrays()[0], [1.0, 1.0, 1.0])
    assert "node 424242 excluded: it was not sent a message this round" in caplog.text


def test_joining_nodes_get_a_fair_share_and_leaving_nodes_are_dropped() -> None:
    grid = InProcessGrid(echo_app, num_nodes=4)
    strategy = ISFedAvg(clients_per_round=2)
    node_ids = strategy.sync_nodes(grid.get_node_ids())
    strategy.client_probs.update(zip(node_ids, [0.1, 0.2, 0.3, 0.4], strict=True))
    grid.remove_node(node_ids[3])
    newcomer = grid.add_node(4, 5)
    connected = strategy.sync_nodes(grid.get_node_ids())
    assert set(connected) == {*node_ids[:3], newcomer}
    for table in (strategy.client_probs, strategy.local_steps, strategy.batch_sizes):
        assert set(table) == set(connected)
    # The stayers hold 0.6, the newcomer 1/K = 1/4; then all are renormalized.
    total = 0.6 + 0.25
    assert strategy.client_probs[newcomer] == pytest.approx(0.25 / total)
    for node, prob in zip(node_ids[:3], [0.1, 0.2, 0.3], strict=True):
        assert strategy.client_probs[node] == pytest.approx(prob / total)


@pytest.mark.parametrize("keep_app_step_size", [False, True])
def test_keep_app_step_size_tells_clients_not_to_divide_by_local_steps(
    keep_app_step_size: bool,
) -> None:
    grid = InProcessGrid(echo_app, num_nodes=4)
    strategy = ISFedAvg(clients_per_round=2, keep_app_step_size=keep_app_step_size)
    for message in configured(strategy, grid):
        divides = config_of(message)[ISFEDAVG_DIVIDE_BY_LOCAL_STEPS]
        assert divides is not keep_app_step_size


def test_uniform_mode_keeps_probabilities_at_one_over_k() -> None:
    grid = InProcessGrid(echo_app, num_nodes=5)
    strategy = ISFedAvg(clients_per_round=2, uniform=True)
    messages = configured(strategy, grid)
    for message in messages:
        assert config_of(message)[ISFEDAVG_CLIENT_PROB] == pytest.approx(0.2)
        assert config_of(message)[ISFEDAVG_ADAPT_SAMPLE_PROBS] is False
    replies = [reply_to(messages[0], [1.0] * 3, 5.0, 1.0)]
    replies.append(reply_to(messages[1], [1.0] * 3, 0.1, 0.0))
    strategy.aggregate_train(1, replies)
    configured(strategy, grid, 2)
    assert all(prob == 0.2 for prob in strategy.client_probs.values())


def test_training_runs_with_unresponsive_nodes_and_adapts_probabilities() -> None:
    grid = InProcessGrid(isfedavg_app, num_nodes=10)
    node_ids = sorted(grid.get_node_ids())
    for silent in node_ids[:3]:
        grid.set_responsive(silent, False)
    strategy = ISFedAvg(
        clients_per_round=4,
        local_steps_range=(1, 3),
        batch_size_range=(2, 4),
        fraction_evaluate=0.0,
        seed=11,
    )
    initial = ArrayRecord(regression_task().model.state_dict())
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=6)
    final = result.arrays.to_numpy_ndarrays()[0]
    assert np.all(np.isfinite(final))
    assert not np.allclose(final, initial.to_numpy_ndarrays()[0])
    assert len(result.train_metrics_clientapp) == 6
    probs = np.array(list(strategy.client_probs.values()))
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    assert probs.min() >= 0.1 / 10 / (1 + 0.1) and not np.allclose(probs, 0.1)


def test_regression_preset_runs_in_the_simulation_app(tmp_path: Path) -> None:
    overrides = {
        **load_preset("isfedavg-regression"),
        "num-server-rounds": 10,
        "clients-per-round": 4,
        "local-lr": 0.05,
        "samples-per-client": 20,
        "output-dir": str(tmp_path),
    }
    rows, grid = run_inprocess(overrides, num_clients=30)
    assert [row["round"] for row in rows] == list(range(11))
    assert rows[-1]["msd"] < 0.5 * rows[0]["msd"]
    assert all(row[ISFEDAVG_SIGMA2] >= 0 for row in rows[1:])
    trained = [
        node
        for node in grid.get_node_ids()
        if SAMPLE_STATE_KEY in grid.node_state(node)
    ]
    assert 4 <= len(trained) <= 40
