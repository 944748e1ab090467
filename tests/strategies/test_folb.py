"""FOLB on the in-process grid: crafted replies against eqs. 9, 13, 18 by hand.

The hand computations weigh every device by its reported sample count ``n_k``
(the paper's ``n_k / n`` objective) unless ``weighting="uniform"``.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.folb import FOLB
from flwr_importance.tooling.testing import InProcessGrid

NUM_NODES = 6
DIMENSION = 3
RNG = np.random.default_rng(7)
# Crafted per-partition replies: updates dw_k, gradients g_k and gamma_k.
UPDATES = RNG.normal(size=(NUM_NODES, DIMENSION))
GRADIENTS = RNG.normal(size=(NUM_NODES, DIMENSION)) + np.array([1.0, 0.5, 0.0])
GAMMAS = RNG.uniform(0.0, 1.0, size=NUM_NODES)
# n_k, unequal so that a rule ignoring them cannot pass.
SAMPLES = np.array([5, 40, 12, 3, 25, 60])
INITIAL = np.array([0.5, -1.0, 2.0])


def record(vector: np.ndarray) -> ArrayRecord:
    """A two-array record (``w`` and ``b``) holding ``vector``."""
    return ArrayRecord.from_array_dict(
        {"w": Array(vector[:2].copy()), "b": Array(vector[2:].copy())}
    )


def crafted_app(bad_partition: int | None = None) -> ClientApp:
    """A ClientApp replying with the crafted arrays of its partition."""
    app = ClientApp()

    def partition(context: Context) -> int:
        return int(context.node_config["partition-id"])

    @app.train()
    def train(message: Message, context: Context) -> Message:
        k = partition(context)
        gradient = GRADIENTS[k].copy()
        if k == bad_partition:
            gradient[0] = np.nan
        content = RecordDict(
            {
                "update": record(UPDATES[k]),
                "gradient": record(gradient),
                "metrics": MetricRecord(
                    {"gamma": GAMMAS[k], "num-examples": int(SAMPLES[k])}
                ),
            }
        )
        return Message(content, reply_to=message)

    @app.query("gradient")
    def gradient(message: Message, context: Context) -> Message:
        k = partition(context)
        content = RecordDict(
            {
                "gradient": record(GRADIENTS[k]),
                "metrics": MetricRecord({"num-examples": int(SAMPLES[k])}),
            }
        )
        return Message(content, reply_to=message)

    return app


def run_one_round(
    strategy: FOLB, bad_partition: int | None = None
) -> tuple[np.ndarray, InProcessGrid]:
    grid = InProcessGrid(crafted_app(bad_partition), NUM_NODES, seed=3)
    result = strategy.start(grid, record(INITIAL), num_rounds=1)
    return flatten(result.arrays), grid


def sent_to(grid: InProcessGrid, message_type: str) -> list[int]:
    """Destination nodes of the ``message_type`` messages the server sent."""
    return [
        rec.node_id
        for rec in grid.wire_log
        if rec.direction == "to-node" and rec.message_type == message_type
    ]


def by_partition(draws: Counter[int], grid: InProcessGrid) -> dict[int, int]:
    return {grid.partition_of(node): count for node, count in draws.items()}


def expected_model(
    train: dict[int, int],
    reference: dict[int, int],
    psi: float = 0.0,
    samples: np.ndarray = SAMPLES,
    server_lr: float = 1.0,
) -> np.ndarray:
    """The eq. 9/13/18 update written out with plain loops (``n_k = samples``)."""
    global_gradient = sum(
        m * samples[k] * GRADIENTS[k] for k, m in reference.items()
    ) / sum(m * samples[k] for k, m in reference.items())
    scores = {
        k: GRADIENTS[k] @ global_gradient
        - psi
        * GAMMAS[k]
        * np.linalg.norm(GRADIENTS[k])
        * np.linalg.norm(global_gradient)
        for k in train
    }
    denominator = sum(m * samples[k] * abs(scores[k]) for k, m in train.items())
    return INITIAL + server_lr * sum(
        m * samples[k] * scores[k] / denominator * UPDATES[k] for k, m in train.items()
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_single_set_matches_eq13_with_distinct_draws(seed: int) -> None:
    strategy = FOLB(clients_per_round=5, seed=seed, fraction_evaluate=0.0)
    model, grid = run_one_round(strategy)
    train, reference = strategy.last_draws
    assert len(train) == 5 and set(train.values()) == {1} and not reference
    partitions = by_partition(train, grid)
    np.testing.assert_allclose(model, expected_model(partitions, partitions), atol=1e-6)


def test_uniform_weighting_ignores_the_sample_counts() -> None:
    strategy = FOLB(
        clients_per_round=4, weighting="uniform", seed=1, fraction_evaluate=0.0
    )
    model, grid = run_one_round(strategy)
    partitions = by_partition(strategy.last_draws[0], grid)
    ones = np.ones(NUM_NODES)
    expected = expected_model(partitions, partitions, samples=ones)
    np.testing.assert_allclose(model, expected, atol=1e-6)
    # The sample-weighted rule moves elsewhere: the counts matter.
    assert not np.allclose(expected, expected_model(partitions, partitions))


def test_server_lr_scales_the_aggregated_step() -> None:
    strategy = FOLB(clients_per_round=4, server_lr=2.5, seed=1, fraction_evaluate=0.0)
    model, grid = run_one_round(strategy)
    partitions = by_partition(strategy.last_draws[0], grid)
    np.testing.assert_allclose(
        model, expected_model(partitions, partitions, server_lr=2.5), atol=1e-6
    )


def test_heterogeneity_aware_matches_eq18() -> None:
    strategy = FOLB(
        clients_per_round=5, psi=0.3, replace=True, seed=4, fraction_evaluate=0.0
    )
    model, grid = run_one_round(strategy)
    partitions = by_partition(strategy.last_draws[0], grid)
    np.testing.assert_allclose(
        model, expected_model(partitions, partitions, psi=0.3), atol=1e-6
    )


@pytest.mark.parametrize(("seed", "replace"), [(0, False), (5, True)])
def test_two_set_matches_eq9_and_queries_only_s2(seed: int, replace: bool) -> None:
    strategy = FOLB(
        clients_per_round=3,
        mode="two-set",
        replace=replace,
        seed=seed,
        fraction_evaluate=0.0,
    )
    model, grid = run_one_round(strategy)
    train, reference = strategy.last_draws
    assert sum(reference.values()) == 3
    train_nodes = sent_to(grid, "train")
    query_nodes = sent_to(grid, "query.gradient")
    assert len(grid.wire_log) == 2 * (len(train_nodes) + len(query_nodes))
    assert sorted(train_nodes) == sorted(train)  # once per distinct S1 node
    assert set(query_nodes) == set(reference) - set(train)
    assert len(query_nodes) == len(set(query_nodes))
    np.testing.assert_allclose(
        model,
        expected_model(by_partition(train, grid), by_partition(reference, grid)),
        atol=1e-6,
    )


def test_a_node_drawn_twice_trains_once_and_counts_twice() -> None:
    # With 6 nodes and 8 draws some node is always drawn at least twice.
    strategy = FOLB(
        clients_per_round=8,
        replace=True,
        min_available_nodes=NUM_NODES,
        seed=0,
        fraction_evaluate=0.0,
    )
    model, grid = run_one_round(strategy)
    train, _ = strategy.last_draws
    assert max(train.values()) >= 2
    assert sorted(sent_to(grid, "train")) == sorted(train)
    partitions = by_partition(train, grid)
    np.testing.assert_allclose(model, expected_model(partitions, partitions), atol=1e-6)


def test_nan_gradient_reply_is_excluded_and_the_round_goes_on() -> None:
    strategy = FOLB(
        clients_per_round=NUM_NODES,
        seed=1,
        fraction_evaluate=0.0,
    )  # every node drawn
    model, grid = run_one_round(strategy, bad_partition=2)
    assert 2 in by_partition(strategy.last_draws[0], grid)
    train = {
        grid.partition_of(node): m
        for node, m in strategy.last_draws[0].items()
        if grid.partition_of(node) != 2
    }
    assert np.all(np.isfinite(model))
    np.testing.assert_allclose(model, expected_model(train, train), atol=1e-6)


def test_unresponsive_and_departed_nodes_do_not_break_the_round() -> None:
    strategy = FOLB(clients_per_round=4, mode="two-set", seed=2, fraction_evaluate=0.0)
    grid = InProcessGrid(crafted_app(), NUM_NODES, seed=3)
    nodes = sorted(grid.get_node_ids())
    grid.set_responsive(nodes[0], False)
    grid.set_responsive(nodes[1], False)
    result = strategy.start(grid, record(INITIAL), num_rounds=3)
    grid.remove_node(nodes[2])
    result = strategy.start(grid, result.arrays, num_rounds=2)
    assert np.all(np.isfinite(flatten(result.arrays)))


def test_all_zero_gradients_fall_back_to_the_plain_mean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(f"{__name__}.GRADIENTS", np.zeros((NUM_NODES, DIMENSION)))
    strategy = FOLB(clients_per_round=4, seed=3, fraction_evaluate=0.0)
    model, grid = run_one_round(strategy)
    train = by_partition(strategy.last_draws[0], grid)
    total = sum(m * SAMPLES[k] for k, m in train.items())
    mean = sum(m * SAMPLES[k] * UPDATES[k] for k, m in train.items()) / total
    np.testing.assert_allclose(model, INITIAL + mean, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clients_per_round": 0}, "clients_per_round"),
        ({"proximal_mu": -1.0}, "proximal_mu"),
        ({"mode": "three-set"}, "mode"),
        ({"psi": -0.1}, "psi"),
        ({"negative": "keep"}, "negative"),
        ({"denominator": "max"}, "denominator"),
        ({"penalty": "cube"}, "penalty"),
        ({"weighting": "examples"}, "weighting"),
        ({"weighting": None}, "weighting"),
        ({"replace": "yes"}, "replace"),
        ({"server_lr": 0.0}, "server_lr"),
        ({"server_lr": -1.0}, "server_lr"),
        ({"server_lr": float("nan")}, "server_lr"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_settings_raise(kwargs: dict, message: str) -> None:
    # A value of the wrong type (replace="yes") is a TypeError.
    with pytest.raises((ValueError, TypeError), match=message):
        FOLB(**{"clients_per_round": 10, **kwargs})


@pytest.mark.parametrize("replace", [False, True])
def test_more_draws_than_nodes_warn_and_the_run_finishes(
    replace: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # Formerly min_available_nodes defaulted to K: 20 draws on 6 nodes waited
    # forever for 20 nodes. Now the run goes on with the nodes there are.
    strategy = FOLB(clients_per_round=20, replace=replace, fraction_evaluate=0.0)
    assert strategy.min_available_nodes == 1
    grid = InProcessGrid(crafted_app(), NUM_NODES, seed=3)
    with caplog.at_level(logging.WARNING):
        result = strategy.start(grid=grid, initial_arrays=record(INITIAL), num_rounds=2)
    assert caplog.text.count("6 nodes connected, fewer than clients_per_round=20") == 2
    train, _ = strategy.last_draws
    if replace:
        assert train.total() == 20 and set(train) <= set(grid.get_node_ids())
    else:  # each node once
        assert train == Counter(dict.fromkeys(grid.get_node_ids(), 1))
    assert not np.allclose(flatten(result.arrays), INITIAL)


def test_arguments_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        FOLB(10, 0.01)  # type: ignore[call-arg]
