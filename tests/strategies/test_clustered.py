"""Clustered and MD sampling strategies, driven through the in-process grid.

The ClientApp is built from the library's handlers with a test TaskFactory:
100 nodes, each holding one digit (10 nodes per digit) and a chosen number of
samples, a logistic regression trained for one local step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from flwr_importance.clientapps import LocalTask, TaskFactory
from flwr_importance.clientapps.local_task import make_train_handler
from flwr_importance.clientapps.sizes import make_sizes_handler
from flwr_importance.sampling.distances import (
    DISTANCES,
    Distance,
    cross_distances,
    pairwise_distances,
)
from flwr_importance.sampling.representatives import RepresentativeGradients
from flwr_importance.strategies._multiset import MultisetSampling
from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.clustered import ClusteredSampling
from flwr_importance.strategies.md import MDSampling
from flwr_importance.tasks import Objective, build_model, load_dataset
from flwr_importance.tooling.testing import InProcessGrid

NUM_NODES = 100
DRAWS = 10

ONE_CLASS_DIGITS = load_dataset(
    "digits", NUM_NODES, partitioning="pathological", classes_per_client=1, seed=0
)
# Every partition holds at least this many samples of its digit.
MAX_SIZE = int(ONE_CLASS_DIGITS.partition_sizes.min())


def one_class_task(sizes: Sequence[int]) -> TaskFactory:
    """Partition ``i`` holds the first ``sizes[i]`` samples of its single digit."""

    def task(context: Context) -> LocalTask:
        partition_id = int(context.node_config["partition-id"])
        partition = ONE_CLASS_DIGITS.partitions[partition_id]
        size = sizes[partition_id]
        return LocalTask(
            model=build_model(
                "logreg", ONE_CLASS_DIGITS.input_shape, ONE_CLASS_DIGITS.num_outputs, 0
            ),
            objective=Objective("classification"),
            x=partition.x[:size],
            y=partition.y[:size],
            lr=0.5,
            batch_size=size,
            local_steps=1,
            seed=partition_id,
        )

    return task


def make_grid(sizes: Sequence[int], seed: int = 0) -> InProcessGrid:
    """The library's handlers on ``len(sizes)`` nodes (no serialization: speed)."""
    task = one_class_task(sizes)
    app = ClientApp()
    app.train()(make_train_handler(task))
    app.query("sizes")(make_sizes_handler(task))
    return InProcessGrid(app, len(sizes), seed=seed, serialize=False)


def initial_model() -> ArrayRecord:
    model = build_model(
        "logreg", ONE_CLASS_DIGITS.input_shape, ONE_CLASS_DIGITS.num_outputs, 0
    )
    return ArrayRecord(model.state_dict())


RoundHook = Callable[[int, ArrayRecord, list[Message]], None]


def run_rounds(
    strategy: MultisetSampling,
    grid: InProcessGrid,
    rounds: int,
    arrays: ArrayRecord | None = None,
    first_round: int = 1,
    on_round: RoundHook | None = None,
) -> tuple[ArrayRecord, list[dict[int, int]], list[dict[str, Any]]]:
    """What ``Strategy.start`` does for training: configure, send, aggregate.

    Returns the final model, each round's draw counts and round metrics.
    """
    arrays = arrays or initial_model()
    draws, metrics = [], []
    for server_round in range(first_round, first_round + rounds):
        messages = list(
            strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
        )
        replies = list(grid.send_and_receive(messages))
        draws.append(strategy.drawn_counts)
        new_arrays, round_metrics = strategy.aggregate_train(server_round, replies)
        if on_round is not None:
            on_round(server_round, arrays, replies)
        assert new_arrays is not None and round_metrics is not None
        arrays = new_arrays
        metrics.append(dict(round_metrics))
    return arrays, draws, metrics


def test_algorithm1_on_equal_sizes_aggregates_ten_distinct_clients() -> None:
    grid = make_grid([MAX_SIZE] * NUM_NODES)
    strategy = ClusteredSampling(clients_per_round=DRAWS, method="size", seed=1)
    _, draws, metrics = run_rounds(strategy, grid, rounds=30)
    for counts, round_metrics in zip(draws, metrics, strict=True):
        assert sorted(counts.values()) == [1] * DRAWS
        assert round_metrics["distinct-clients"] == DRAWS
        assert round_metrics["aggregated-draws"] == DRAWS
    assert strategy.sizes == dict.fromkeys(grid.get_node_ids(), MAX_SIZE)


def draw_rounds(
    strategy: MultisetSampling, grid: InProcessGrid, rounds: int
) -> list[dict[int, int]]:
    """Draws of ``rounds`` rounds without training (the draws do not need it)."""
    arrays = initial_model()
    draws = []
    for server_round in range(1, rounds + 1):
        strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
        draws.append(strategy.drawn_counts)
    return draws


# Algorithm 2's draws depend on the returned models, so it trains (fewer rounds).
@pytest.mark.parametrize(
    ("strategy_name", "rounds"), [("md", 1000), ("size", 1000), ("similarity", 150)]
)
def test_selection_frequencies_match_m_p(strategy_name: str, rounds: int) -> None:
    # Sizes 2..MAX_SIZE: p_i = n_i / M_tot spans a factor of about 7, so
    # sampling uniformly (or by any other rule) misses the tolerance.
    sizes = [2 + (7 * i) % (MAX_SIZE - 1) for i in range(NUM_NODES)]
    grid = make_grid(sizes, seed=2)
    if strategy_name == "similarity":
        strategy: MultisetSampling = ClusteredSampling(clients_per_round=DRAWS, seed=3)
        draws = run_rounds(strategy, grid, rounds)[1]
    else:
        strategy = (
            MDSampling(clients_per_round=DRAWS, seed=3)
            if strategy_name == "md"
            else ClusteredSampling(clients_per_round=DRAWS, method="size", seed=3)
        )
        draws = draw_rounds(strategy, grid, rounds)
    totals: Counter[int] = Counter()
    for counts in draws:
        totals.update(counts)
    node_ids = sorted(grid.get_node_ids())
    p = np.array([sizes[grid.partition_of(node)] for node in node_ids]) / sum(sizes)
    observed = np.array([totals[node] for node in node_ids])
    expected = rounds * DRAWS * p
    # Per round, a client's count has mean m p_i (Proposition 1) and variance
    # at most MD's m p_i (1 - p_i) (eq. 17), given the past: 4 standard errors.
    tolerance = 4 * np.sqrt(rounds * DRAWS * p * (1 - p))
    assert np.all(np.abs(observed - expected) <= tolerance), np.max(
        np.abs(observed - expected) / tolerance
    )
    assert all(sum(counts.values()) == DRAWS for counts in draws)


def test_representative_gradients_are_last_updates_and_zero_when_never_replied() -> (
    None
):
    grid = make_grid([MAX_SIZE] * NUM_NODES)
    strategy = ClusteredSampling(clients_per_round=DRAWS, method="similarity", seed=4)
    returned: dict[int, np.ndarray] = {}

    def keep_updates(_: int, global_model: ArrayRecord, replies: list[Message]) -> None:
        for reply in replies:
            if not reply.has_error():
                (record,) = reply.content.array_records.values()
                returned[reply.metadata.src_node_id] = flatten(record) - flatten(
                    global_model
                )

    arrays, draws, _ = run_rounds(strategy, grid, 1, on_round=keep_updates)
    silent = next(node for node in sorted(grid.get_node_ids()) if node not in draws[0])
    grid.set_responsive(silent, False)
    _, later_draws, later_metrics = run_rounds(
        strategy, grid, 20, arrays, first_round=2, on_round=keep_updates
    )

    gradients = strategy.gradients
    assert silent not in returned
    np.testing.assert_array_equal(gradients.gradient(silent), 0.0)
    for node_id, update in returned.items():
        np.testing.assert_allclose(
            gradients.gradient(node_id), update.astype(np.float32), rtol=1e-6
        )
    never_drawn = set(grid.get_node_ids()) - set(returned)
    assert never_drawn, "every node was sampled: the zero case is not exercised"
    for node_id in never_drawn:
        np.testing.assert_array_equal(gradients.gradient(node_id), 0.0)
    # The silent node stays drawable; when drawn, the round goes on without it.
    silent_rounds = [
        index for index, counts in enumerate(later_draws) if silent in counts
    ]
    for index in silent_rounds:
        assert (
            later_metrics[index]["aggregated-draws"]
            == DRAWS - later_draws[index][silent]
        )


def test_a_departed_node_leaves_the_state_and_the_next_round_runs() -> None:
    grid = make_grid([MAX_SIZE] * NUM_NODES)
    strategy = ClusteredSampling(clients_per_round=DRAWS, method="similarity", seed=5)
    arrays, draws, _ = run_rounds(strategy, grid, 2)
    departed = next(iter(draws[-1]))
    assert np.any(strategy.gradients.gradient(departed) != 0)
    grid.remove_node(departed)
    newcomer = grid.add_node(partition_id=0, num_partitions=NUM_NODES)

    arrays, draws, metrics = run_rounds(strategy, grid, 3, arrays, first_round=3)

    assert departed not in strategy.sizes
    assert departed not in strategy.gradients.node_ids
    assert all(departed not in counts for counts in draws)
    assert strategy.sizes[newcomer] == MAX_SIZE
    assert all(round_metrics["aggregated-draws"] == DRAWS for round_metrics in metrics)
    assert np.all(np.isfinite(flatten(arrays)))


def test_a_client_drawn_twice_trains_once_and_counts_twice() -> None:
    # Five nodes, ten draws: repeats are certain.
    grid = make_grid([MAX_SIZE, 3, 5, 7, 9])
    strategy = MDSampling(clients_per_round=DRAWS, seed=6)
    returned: dict[int, np.ndarray] = {}

    def keep_models(_: int, __: ArrayRecord, replies: list[Message]) -> None:
        for reply in replies:
            assert reply.metadata.src_node_id not in returned
            (record,) = reply.content.array_records.values()
            returned[reply.metadata.src_node_id] = flatten(record)

    arrays, draws, metrics = run_rounds(strategy, grid, 1, on_round=keep_models)

    counts = draws[0]
    assert sorted(returned) == sorted(counts)  # one training per distinct client
    assert metrics[0]["distinct-clients"] == len(counts) < DRAWS
    assert max(counts.values()) > 1
    expected = sum(times / DRAWS * returned[node] for node, times in counts.items())
    np.testing.assert_allclose(flatten(arrays), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("distance", DISTANCES)
def test_incremental_distances_equal_a_full_recomputation(distance: Distance) -> None:
    rng = np.random.default_rng(8)
    state = RepresentativeGradients(distance, None, seed=0)
    state.align(list(range(20)))
    for step in range(4):
        updated = rng.choice(state.node_ids, size=5, replace=False)
        state.update({int(node): rng.standard_normal(30) for node in updated})
        incremental = state.distances().copy()
        rows = np.stack([state.gradient(node) for node in state.node_ids])
        np.testing.assert_allclose(
            incremental, pairwise_distances(rows, distance), rtol=1e-5, atol=1e-5
        )
        # Nodes leave and join between rounds; order follows the new list.
        state.align([*state.node_ids[2:], 100 + step, 200 + step])


def recomputed(
    previous: np.ndarray, rows: np.ndarray, stale: list[int], distance: Distance
) -> np.ndarray:
    """``previous`` with every stale row and column computed from the gradients."""
    block = cross_distances(rows[stale], rows, distance)
    expected = previous.copy()
    expected[stale, :] = block
    expected[:, stale] = block.T
    square = expected[np.ix_(stale, stale)]
    expected[np.ix_(stale, stale)] = (square + square.T) / 2
    expected[stale, stale] = 0.0
    return expected


@pytest.mark.parametrize("distance", DISTANCES)
def test_new_nodes_get_the_distances_a_recomputation_gives_to_the_last_bit(
    distance: Distance,
) -> None:
    # 100 nodes of 650 parameters, 10 updates a round: BLAS can round a
    # product of 10 rows differently from one of 100 (OpenBLAS does), so the
    # zero rows of new nodes must stay in the product although their
    # distances are not computed from it.
    rng = np.random.default_rng(9)
    state = RepresentativeGradients(distance, None, seed=0)
    state.align(list(range(100)))
    previous = np.zeros((100, 100))
    stale = set(state.node_ids)
    for joined in ([], [], [500, 501]):
        if joined:
            # Two nodes leave, two join: rows move, the new ones start at zero.
            kept = [node for node in state.node_ids if node not in (3, 40)]
            moved = [state.node_ids.index(node) for node in kept]
            previous = np.pad(previous[np.ix_(moved, moved)], (0, len(joined)))
            state.align(kept + joined)
            stale = (stale & set(kept)) | set(joined)
        updated = rng.choice(state.node_ids[: 100 - len(joined)], 10, replace=False)
        state.update({int(node): rng.standard_normal(650) for node in updated})
        stale |= {int(node) for node in updated}
        rows = np.stack([state.gradient(node) for node in state.node_ids])
        stale_rows = sorted(state.node_ids.index(node) for node in stale)
        expected = recomputed(previous, rows, stale_rows, distance)
        np.testing.assert_array_equal(state.distances(), expected)
        previous, stale = expected, set()


def test_state_size_is_bounded_by_the_projection() -> None:
    # 1,000 clients, 20k-parameter updates sketched to 256 dims: the rows
    # take N * 256 float32 whatever the model size; the sketch, drawn once,
    # one int64 shift per block of 256 parameters and three float32 arrays
    # of the blocks' size, one of them with a block to spare (the signs, two
    # scratch arrays; the benchmark measures a 1M-parameter model).
    nodes, parameters, projection_dim = 1000, 20_000, 256
    state = RepresentativeGradients("arccos", projection_dim, seed=0)
    state.align(list(range(nodes)))
    rng = np.random.default_rng(7)
    blocks = -(-parameters // projection_dim)
    sketch_bytes = blocks * 8 + (3 * blocks + 2) * projection_dim * 4
    expected_bytes = nodes * projection_dim * 4 + nodes * nodes * 8 + sketch_bytes
    for first_node in (0, 10):  # two rounds
        state.update(
            {node: rng.standard_normal(parameters) for node in range(first_node, 20)}
        )
        assert state.distances().shape == (nodes, nodes)
        assert state.nbytes == expected_bytes
    assert state.gradient(0).shape == (projection_dim,)
    np.testing.assert_array_equal(state.gradient(nodes - 1), 0.0)


def test_invalid_parameters_are_rejected() -> None:
    with pytest.raises(ValueError, match="method"):
        ClusteredSampling(clients_per_round=10, method="kmeans")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="distance"):
        ClusteredSampling(clients_per_round=10, distance="cosine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="projection_dim"):
        ClusteredSampling(clients_per_round=10, projection_dim=0)
    with pytest.raises(ValueError, match="clients_per_round"):
        MDSampling(clients_per_round=0)
