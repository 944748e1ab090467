"""OCS and AOCS over an available pool: ``n`` nodes queried, ``m`` sampled among them.

The crafted ClientApp of
:mod:`tests.strategies.test_ocs` gives every
node a fixed update and size. With a pool, ``d_i`` is normalized over the
pool (the authors' form), so the step's expectation is the mean over pools of
each pool's size-weighted mean update: with 12 nodes and pools of 6 that is
an exact average over all 924 pools, which the Monte Carlo mean of the
strategy's steps must meet within ``Z`` standard errors.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
from flwr.app import ConfigRecord
from numpy.typing import NDArray

from flwr_importance.aggregation.variance_reduced import size_fractions
from flwr_importance.sampling.pips import poisson_sample
from flwr_importance.sampling.variance_reduced import (
    available_pool,
    optimal_client_probs,
)
from flwr_importance.strategies.ocs import OptimalClientSampling
from flwr_importance.tooling.testing import InProcessGrid
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.methods import load_method
from tests.strategies.test_ocs import (
    NUM_CLIENTS,
    SIZES,
    UPDATES,
    Z,
    assert_unbiased,
    crafted_app,
    repeated_steps,
    zero_model,
)

POOL = 6
CLIENTS_PER_ROUND = 3


@pytest.fixture
def grid() -> Iterator[InProcessGrid]:
    yield InProcessGrid(crafted_app(), NUM_CLIENTS, seed=3, serialize=False)


def mean_over_pools(sizes: NDArray[np.integer], updates: NDArray[np.floating]):  # type: ignore[no-untyped-def]
    """The exact mean, over every pool of ``POOL`` nodes, of its weighted mean."""
    means = [
        size_fractions(sizes[list(pool)]) @ updates[list(pool)]
        for pool in itertools.combinations(range(len(sizes)), POOL)
    ]
    return np.mean(means, axis=0)


@pytest.mark.parametrize("approximate", [False, True])
def test_pooled_step_is_unbiased_for_the_mean_pool_weighted_update(
    grid: InProcessGrid, approximate: bool
) -> None:
    strategy = OptimalClientSampling(
        clients_per_round=CLIENTS_PER_ROUND,
        pool_size=POOL,
        approximate=approximate,
        seed=5,
    )
    steps = repeated_steps(strategy, grid, 1)
    by_partition = mean_over_pools(SIZES[:, 0], UPDATES[:, 0])
    assert_unbiased(steps, by_partition[None, :])


def test_only_the_pool_is_queried_each_node_in_it_with_probability_n_over_n(
    grid: InProcessGrid,
) -> None:
    strategy = OptimalClientSampling(
        clients_per_round=CLIENTS_PER_ROUND, pool_size=POOL, seed=2
    )
    rounds = 600
    counts = dict.fromkeys(grid.get_node_ids(), 0)
    for server_round in range(1, rounds + 1):
        messages = list(
            strategy.configure_train(server_round, zero_model(), ConfigRecord(), grid)
        )
        plan = strategy.plan
        assert plan is not None and len(plan.node_ids) == POOL
        assert {message.metadata.dst_node_id for message in messages} <= set(
            plan.node_ids
        )
        for node in plan.node_ids:
            counts[node] += 1
    probability = POOL / NUM_CLIENTS
    error = np.sqrt(probability * (1 - probability) / rounds)
    frequencies = np.array(list(counts.values())) / rounds
    assert np.all(np.abs(frequencies - probability) <= Z * error)


def test_equal_sizes_make_the_pooled_estimate_unbiased_for_the_population() -> None:
    """Pure functions: pool, optimal ``p`` over it, Poisson draw, ``sum d/p U``."""
    rng = np.random.default_rng(9)
    num_nodes, dimension, draws = 40, 3, 20_000
    updates = np.exp(rng.normal(0, 1.0, (num_nodes, 1))) * rng.normal(
        size=(num_nodes, dimension)
    )
    estimates = np.zeros((draws, dimension))
    for draw in range(draws):
        pool = np.array(available_pool(range(num_nodes), 8, rng))
        fractions = np.full(pool.size, 1 / pool.size)
        probs = optimal_client_probs(
            fractions * np.linalg.norm(updates[pool], axis=1), 2
        )
        sampled = poisson_sample(probs, rng)
        estimates[draw] = (fractions[sampled] / probs[sampled]) @ updates[pool][sampled]
    error = estimates.std(axis=0) / np.sqrt(draws)
    assert np.all(np.abs(estimates.mean(axis=0) - updates.mean(axis=0)) <= Z * error)


def test_the_uniform_control_draws_the_same_pools_and_uniforms(
    grid: InProcessGrid,
) -> None:
    runs = {
        uniform: OptimalClientSampling(
            clients_per_round=CLIENTS_PER_ROUND, pool_size=POOL, uniform=uniform, seed=4
        )
        for uniform in (False, True)
    }
    for server_round in range(1, 30):
        pools = []
        for strategy in runs.values():
            strategy.configure_train(server_round, zero_model(), ConfigRecord(), grid)
            assert strategy.plan is not None
            pools.append(strategy.plan.node_ids)
        assert pools[0] == pools[1]
    control = runs[True].plan
    assert control is not None
    np.testing.assert_array_equal(control.probs[:, 0], CLIENTS_PER_ROUND / POOL)


def test_a_pool_smaller_than_the_sample_is_refused() -> None:
    with pytest.raises(ValueError, match="pool_size"):
        OptimalClientSampling(clients_per_round=4, pool_size=3)
    with pytest.raises(TypeError, match="pool_size"):
        OptimalClientSampling(clients_per_round=4, pool_size=8.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(("key", "expected"), [(0, None), (32, 32)])
def test_the_app_option_sets_the_pool(key: int, expected: int | None) -> None:
    config = ExperimentConfig.from_run_config(
        resolve_run_config({"strategy": "ocs", "ocs-pool-size": key})
    )
    strategy = load_method("ocs").build_strategy(config, 100)
    assert isinstance(strategy, OptimalClientSampling)
    assert strategy.pool_size == expected
