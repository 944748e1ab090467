"""The unbiased estimator ``sum (d_i / p_i) U_i`` of OCS and MMFL.

Monte Carlo checks use fixed seeds and tolerances of ``Z`` standard errors of
the number of draws.
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from flwr_importance.aggregation.variance_reduced import (
    size_fractions,
    unbiased_update,
    unbiased_weights,
    uniform_assignment_prob,
)
from flwr_importance.sampling.pips import poisson_sample
from flwr_importance.sampling.variance_reduced import (
    assign_models,
    estimator_variance,
    mmfl_probs,
    optimal_client_probs,
)

#: Standard errors allowed between an empirical mean and its target.
Z = 5.0
DRAWS = 4000


def heterogeneous_updates(
    num_clients: int, dimension: int, rng: np.random.Generator
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Updates whose norms span two orders of magnitude, and skewed sizes."""
    scales = np.exp(rng.normal(0.0, 1.5, num_clients))
    updates = scales[:, None] * rng.normal(size=(num_clients, dimension))
    sizes = rng.integers(5, 200, num_clients).astype(np.float64)
    return updates, sizes


def sampled_estimates(
    updates: NDArray[np.float64],
    fractions: NDArray[np.float64],
    probs: NDArray[np.float64],
    rng: np.random.Generator,
) -> NDArray[np.float64]:
    """``DRAWS`` realizations of the estimator under independent participation."""
    estimates = np.zeros((DRAWS, updates.shape[1]))
    for draw in range(DRAWS):
        sampled = poisson_sample(probs, rng)
        if sampled.size:
            estimates[draw] = unbiased_update(
                list(updates[sampled]), fractions[sampled], probs[sampled]
            )
    return estimates


def test_size_fractions_normalize_each_model_column() -> None:
    fractions = size_fractions([[1, 0], [3, 0]])
    np.testing.assert_allclose(fractions, [[0.25, 0.0], [0.75, 0.0]])
    np.testing.assert_allclose(size_fractions([2, 6]), [0.25, 0.75])
    with pytest.raises(ValueError, match="negative"):
        size_fractions([1, -1])
    with pytest.raises(ValueError, match="1-D or 2-D"):
        size_fractions(np.ones((2, 2, 2)))


def test_unbiased_weights_are_d_over_p_and_reject_impossible_draws() -> None:
    np.testing.assert_allclose(unbiased_weights([0.2, 0.3], [0.5, 1.0]), [0.4, 0.3])
    with pytest.raises(ValueError, match="probability 0"):
        unbiased_weights([0.2], [0.0])
    with pytest.raises(ValueError, match="same shape"):
        unbiased_weights([0.2, 0.1], [0.5])


def test_uniform_assignment_prob_is_m_over_n_s_with_m_clamped() -> None:
    assert uniform_assignment_prob(120, 5, 12) == pytest.approx(12 / 600)
    assert uniform_assignment_prob(4, 2, 10) == pytest.approx(4 / 8)
    with pytest.raises(ValueError):
        uniform_assignment_prob(0, 1, 1)


@pytest.mark.parametrize("m", [3, 8])
def test_ocs_estimate_is_unbiased_and_beats_uniform(m: int) -> None:
    rng = np.random.default_rng(11)
    updates, sizes = heterogeneous_updates(20, 6, rng)
    fractions = size_fractions(sizes)
    full_update = fractions @ updates
    norms = fractions * np.linalg.norm(updates, axis=1)
    optimal = optimal_client_probs(norms, m)
    uniform = np.full(norms.size, m / norms.size)
    optimal_draws = sampled_estimates(updates, fractions, optimal, rng)
    uniform_draws = sampled_estimates(updates, fractions, uniform, rng)

    standard_error = optimal_draws.std(axis=0) / np.sqrt(DRAWS)
    assert np.all(
        np.abs(optimal_draws.mean(axis=0) - full_update) <= Z * standard_error
    )

    # The mean squared error estimates the analytic variance of each scheme ...
    for draws, probs in ((optimal_draws, optimal), (uniform_draws, uniform)):
        squared_errors = np.sum((draws - full_update) ** 2, axis=1)
        tolerance = Z * squared_errors.std() / np.sqrt(DRAWS)
        expected = estimator_variance(norms, probs)
        assert abs(squared_errors.mean() - expected) <= tolerance
    # ... and the optimal one is below uniform's at equal expected participation.
    optimal_errors = np.sum((optimal_draws - full_update) ** 2, axis=1)
    uniform_errors = np.sum((uniform_draws - full_update) ** 2, axis=1)
    gap_error = np.sqrt(optimal_errors.var() / DRAWS + uniform_errors.var() / DRAWS)
    assert optimal.sum() == pytest.approx(uniform.sum())
    assert uniform_errors.mean() - optimal_errors.mean() > Z * gap_error


def test_mmfl_estimate_is_unbiased_per_model_and_beats_random_assignment() -> None:
    rng = np.random.default_rng(5)
    num_clients, num_models, m = 15, 3, 5
    updates = np.stack(
        [heterogeneous_updates(num_clients, 4, rng)[0] for _ in range(num_models)],
        axis=1,
    )  # (N, S, dimension)
    sizes = rng.integers(5, 200, (num_clients, num_models)).astype(np.float64)
    fractions = size_fractions(sizes)
    full_updates = np.einsum("is,isd->sd", fractions, updates)
    norms = fractions * np.linalg.norm(updates, axis=2)
    probs = mmfl_probs(norms, m)
    random_probs = np.full_like(
        probs, uniform_assignment_prob(num_clients, num_models, m)
    )
    errors: dict[str, list[float]] = {"mmfl": [], "random": []}
    estimates = np.zeros((DRAWS, num_models, updates.shape[2]))
    for draw in range(DRAWS):
        for name, scheme in (("mmfl", probs), ("random", random_probs)):
            models = assign_models(scheme, rng)
            squared_error = 0.0
            for model in range(num_models):
                active = np.flatnonzero(models == model)
                estimate = np.zeros(updates.shape[2])
                if active.size:
                    estimate = unbiased_update(
                        list(updates[active, model]),
                        fractions[active, model],
                        scheme[active, model],
                    )
                if name == "mmfl":
                    estimates[draw, model] = estimate
                squared_error += float(np.sum((estimate - full_updates[model]) ** 2))
            errors[name].append(squared_error)

    standard_error = estimates.std(axis=0) / np.sqrt(DRAWS)
    assert np.all(np.abs(estimates.mean(axis=0) - full_updates) <= Z * standard_error)
    mmfl_errors, random_errors = np.array(errors["mmfl"]), np.array(errors["random"])
    assert abs(mmfl_errors.mean() - estimator_variance(norms, probs)) <= Z * (
        mmfl_errors.std() / np.sqrt(DRAWS)
    )
    gap_error = np.sqrt((mmfl_errors.var() + random_errors.var()) / DRAWS)
    assert random_errors.mean() - mmfl_errors.mean() > Z * gap_error
