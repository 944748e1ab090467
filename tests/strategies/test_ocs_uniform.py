"""OCS's uniform control: ``p_i = m / N``, OCS's estimator, draws paired with OCS's.

The crafted ClientApp of
:mod:`tests.strategies.test_ocs` gives every
node a fixed update, norm and size, so the exact full-participation step and
the estimator's variance are known. Tolerances are ``Z`` standard errors of
the Monte Carlo estimate.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from flwr.app import ConfigRecord
from numpy.typing import NDArray

from flwr_importance.aggregation.variance_reduced import size_fractions
from flwr_importance.sampling.variance_reduced import (
    estimator_variance,
    optimal_client_probs,
)
from flwr_importance.strategies.ocs import OptimalClientSampling, SamplePlan
from flwr_importance.tooling.testing import InProcessGrid
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.methods import load_method
from tests.strategies.test_ocs import (
    NUM_CLIENTS,
    ROUNDS,
    SIZES,
    UPDATES,
    Z,
    assert_unbiased,
    crafted_app,
    one_round,
    repeated_steps,
    squared_errors,
    zero_model,
)

CLIENTS_PER_ROUND = 4
#: Rounds of the inclusion test: each node's frequency then has a standard
#: error of sqrt(p (1 - p) / DRAW_ROUNDS), about 0.015 at p = 1/3.
DRAW_ROUNDS = 1_000


@pytest.fixture
def grid() -> Iterator[InProcessGrid]:
    yield InProcessGrid(crafted_app(), NUM_CLIENTS, seed=3, serialize=False)


def sampled_rows(plan: SamplePlan) -> NDArray[np.intp]:
    """The plan's sampled nodes as rows of its probability matrix, increasing."""
    return np.array(sorted(plan.row_of(node) for node in plan.assigned), np.intp)


def test_uniform_includes_each_node_with_probability_m_over_n(
    grid: InProcessGrid,
) -> None:
    strategy = OptimalClientSampling(
        clients_per_round=CLIENTS_PER_ROUND, uniform=True, seed=11
    )
    probability = CLIENTS_PER_ROUND / NUM_CLIENTS
    counts = np.zeros(NUM_CLIENTS)
    for server_round in range(1, DRAW_ROUNDS + 1):
        strategy.configure_train(server_round, zero_model(), ConfigRecord(), grid)
        plan = strategy.plan
        assert plan is not None
        np.testing.assert_array_equal(plan.probs[:, 0], probability)
        counts[sampled_rows(plan)] += 1
    frequencies = counts / DRAW_ROUNDS
    standard_error = np.sqrt(probability * (1 - probability) / DRAW_ROUNDS)
    assert np.all(np.abs(frequencies - probability) <= Z * standard_error)
    # The expected sample size is m: the total count is Binomial(R N, m / N).
    total_error = np.sqrt(NUM_CLIENTS * probability * (1 - probability) / DRAW_ROUNDS)
    assert abs(counts.sum() / DRAW_ROUNDS - CLIENTS_PER_ROUND) <= Z * total_error


def test_uniform_step_is_unbiased_with_the_uniform_variance(
    grid: InProcessGrid,
) -> None:
    strategy = OptimalClientSampling(clients_per_round=3, uniform=True, seed=1)
    fractions = size_fractions(SIZES[:, 0])
    full = (fractions @ UPDATES[:, 0])[None, :]
    steps = repeated_steps(strategy, grid, 1)
    assert_unbiased(steps, full)
    errors = squared_errors(steps, full)
    norms = fractions * np.linalg.norm(UPDATES[:, 0], axis=1)
    expected = estimator_variance(norms, np.full(NUM_CLIENTS, 3 / NUM_CLIENTS))
    assert abs(errors.mean() - expected) <= Z * errors.std() / np.sqrt(ROUNDS)
    _, metrics = one_round(strategy, grid, zero_model())
    assert metrics is not None
    assert metrics["variance"] == pytest.approx(expected, rel=1e-12)
    assert metrics["uniform-variance"] == metrics["variance"]


def test_same_seed_gives_ocs_and_its_control_the_same_uniforms(
    grid: InProcessGrid,
) -> None:
    """Paired draws: round t's uniforms ``u_1..u_N`` are the same in both runs.

    Replaying the seed's generator, ``N`` uniforms per round, must give each
    run's sample as ``{i : u_i < p_i}`` with its own probabilities: OCS's
    optimal ones, the control's ``m / N``.
    """
    seed, rounds = 7, 200
    runs = {
        uniform: OptimalClientSampling(
            clients_per_round=CLIENTS_PER_ROUND, uniform=uniform, seed=seed
        )
        for uniform in (False, True)
    }
    samples: dict[bool, list[NDArray[np.intp]]] = {False: [], True: []}
    for uniform, strategy in runs.items():
        for server_round in range(1, rounds + 1):
            strategy.configure_train(server_round, zero_model(), ConfigRecord(), grid)
            assert strategy.plan is not None
            samples[uniform].append(sampled_rows(strategy.plan))
    ocs_plan = runs[False].plan
    assert ocs_plan is not None
    ocs_probs = ocs_plan.probs[:, 0]
    norms = size_fractions(SIZES[:, 0]) * np.linalg.norm(UPDATES[:, 0], axis=1)
    by_node = [grid.partition_of(node) for node in ocs_plan.node_ids]
    np.testing.assert_allclose(
        ocs_probs, optimal_client_probs(norms[by_node], CLIENTS_PER_ROUND)
    )
    replay = np.random.default_rng(seed)
    differing_rounds = 0
    for ocs_rows, uniform_rows in zip(samples[False], samples[True], strict=True):
        uniforms = replay.random(NUM_CLIENTS)
        np.testing.assert_array_equal(ocs_rows, np.flatnonzero(uniforms < ocs_probs))
        np.testing.assert_array_equal(
            uniform_rows, np.flatnonzero(uniforms < CLIENTS_PER_ROUND / NUM_CLIENTS)
        )
        differing_rounds += not np.array_equal(ocs_rows, uniform_rows)
    # The pairing is tested on samples that do differ, where the probabilities do.
    assert differing_rounds > 0


def test_uniform_refuses_approximate() -> None:
    with pytest.raises(ValueError, match="approximate"):
        OptimalClientSampling(clients_per_round=2, uniform=True, approximate=True)


@pytest.mark.parametrize("uniform", [False, True])
def test_the_app_option_selects_the_control(uniform: bool) -> None:
    config = ExperimentConfig.from_run_config(
        resolve_run_config({"strategy": "ocs", "ocs-uniform": uniform})
    )
    strategy = load_method("ocs").build_strategy(config, 10)
    assert isinstance(strategy, OptimalClientSampling)
    assert strategy.uniform is uniform
    assert strategy.mode_name == ("uniform" if uniform else "OCS")
