"""OCS and MMFL probabilities, model assignment, the variance objective, AOCS.

Optimality is checked three ways: against a numerical optimizer on tiny
problems, through the KKT conditions, and against many random feasible
alternatives. Statistical checks use fixed seeds and tolerances derived from
the number of draws.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from numpy.typing import NDArray
from scipy.optimize import minimize

from flwr_importance.sampling.pips import capped_inclusion_probs, poisson_sample
from flwr_importance.sampling.variance_reduced import (
    aocs_probs,
    assign_models,
    estimator_variance,
    mmfl_probs,
    optimal_client_probs,
)

#: Standard errors allowed between an empirical mean and its target.
Z = 5.0

norm_entries = st.one_of(
    st.just(0.0), st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False)
)
norm_vectors = arrays(np.float64, st.integers(1, 30), elements=norm_entries)
norm_matrices = arrays(
    np.float64,
    st.tuples(st.integers(1, 20), st.integers(1, 5)),
    elements=norm_entries,
)


def binomial_tolerance(target: NDArray[np.float64], draws: int) -> NDArray[np.float64]:
    """``Z`` standard errors of a frequency with success probability ``target``."""
    return Z * np.sqrt(target * (1 - target) / draws) + 1e-12


def no_worse_than(optimum: float, alternative: float) -> bool:
    """Whether ``optimum`` is at most ``alternative`` up to float rounding."""
    return optimum <= alternative * (1 + 1e-9) + 1e-9


def numerical_optimum(norms: NDArray[np.float64], m: int) -> NDArray[np.float64]:
    """Slow reference: minimize the variance with a general-purpose solver."""
    result = minimize(
        lambda probs: np.sum(norms**2 / probs),
        x0=np.full(norms.size, m / norms.size),
        jac=lambda probs: -(norms**2) / probs**2,
        bounds=[(1e-9, 1.0)] * norms.size,
        constraints=[{"type": "eq", "fun": lambda probs: probs.sum() - m}],
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 1_000},
    )
    assert result.success, result.message
    return np.asarray(result.x)


# --- optimal_client_probs ------------------------------------------------------


def test_optimal_client_probs_hand_computed() -> None:
    # k = 3: (2 - 4 + 3) = 1 <= (1 + 1 + 1) / 1, and k = 4 fails (2 * 10 > 13).
    np.testing.assert_allclose(
        optimal_client_probs([1.0, 10.0, 1.0, 1.0], 2), [1 / 3, 1.0, 1 / 3, 1 / 3]
    )


@pytest.mark.parametrize(
    ("norms", "m", "expected"),
    [
        ([2.0, 1.0, 3.0], 3, [1.0, 1.0, 1.0]),  # m = N saturates
        ([2.0, 0.0, 3.0], 5, [1.0, 0.0, 1.0]),  # m > N is clamped
        ([0.0, 4.0, 0.0, 0.0], 2, [0.0, 1.0, 0.0, 0.0]),  # too few positive
        ([0.0, 1.0, 3.0], 1, [0.0, 0.25, 0.75]),  # zero norm left out
        ([0.0, 0.0], 1, [0.0, 0.0]),
        ([1.0, 2.0], 0, [0.0, 0.0]),
    ],
)
def test_optimal_client_probs_edge_cases(
    norms: list[float], m: int, expected: list[float]
) -> None:
    np.testing.assert_allclose(optimal_client_probs(norms, m), expected)


@pytest.mark.parametrize(
    ("norms", "m"),
    [
        ([1.0, 2.0, 3.0, 4.0, 5.0], 2),
        ([0.1, 0.2, 5.0, 8.0, 0.3], 3),  # two saturated clients
        ([1.0, 1.0, 1.0, 1.0, 30.0], 2),  # one saturated client
        ([0.5, 3.0, 0.01, 2.0, 0.7], 4),
    ],
)
def test_optimal_client_probs_matches_numerical_optimum(
    norms: list[float], m: int
) -> None:
    norms_array = np.array(norms)
    probs = optimal_client_probs(norms_array, m)
    reference = numerical_optimum(norms_array, m)
    np.testing.assert_allclose(probs, reference, atol=1e-5)
    assert no_worse_than(
        estimator_variance(norms_array, probs),
        estimator_variance(norms_array, reference),
    )


@settings(max_examples=200, deadline=None)
@given(norms=norm_vectors, data=st.data())
def test_optimal_client_probs_constraints_and_kkt(
    norms: NDArray[np.float64], data: st.DataObject
) -> None:
    m = data.draw(st.integers(0, norms.size + 2))
    probs = optimal_client_probs(norms, m)
    positive = norms > 0
    assert np.all((probs >= 0) & (probs <= 1))
    assert np.all(probs[~positive] == 0)
    expected_total = min(m, int(np.count_nonzero(positive)))
    assert probs.sum() == pytest.approx(expected_total, rel=1e-12, abs=1e-12)
    # KKT of min sum u^2/p s.t. sum p = m, p <= 1: u/p is one constant c on
    # the unsaturated clients, and every saturated client has u >= c.
    unsaturated = positive & (probs < 1.0)
    if expected_total > 0 and unsaturated.any():
        ratios = norms[unsaturated] / probs[unsaturated]
        np.testing.assert_allclose(ratios, ratios[0], rtol=1e-9)
        saturated = positive & (probs == 1.0)
        assert np.all(norms[saturated] >= ratios[0] * (1 - 1e-9))


@settings(max_examples=200, deadline=None)
@given(norms=norm_vectors, data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_optimal_client_probs_beats_random_feasible_alternatives(
    norms: NDArray[np.float64], data: st.DataObject, seed: int
) -> None:
    m = data.draw(st.integers(0, int(np.count_nonzero(norms))))
    optimum = optimal_client_probs(norms, m)
    best = estimator_variance(norms, optimum)
    rng = np.random.default_rng(seed)
    alternatives = [np.full(norms.size, m / norms.size)]
    for _ in range(10):
        random_probs = capped_inclusion_probs(rng.exponential(size=norms.size), m)
        mixing = rng.uniform()
        alternatives += [random_probs, mixing * optimum + (1 - mixing) * random_probs]
    for alternative in alternatives:
        assert alternative.sum() == pytest.approx(m)
        assert no_worse_than(best, estimator_variance(norms, alternative))


def test_optimal_client_probs_at_a_million_clients() -> None:
    # Speed is measured in benchmarks/sampling_overhead.py; here only correctness.
    norms = np.random.default_rng(9).lognormal(0.0, 2.0, size=1_000_000)
    probs = optimal_client_probs(norms, 10_000)
    assert probs.sum() == pytest.approx(10_000)
    assert probs.max() <= 1.0


@pytest.mark.parametrize(
    ("norms", "m", "message"),
    [
        ([1.0, -2.0], 1, "negative"),
        ([1.0, np.inf], 1, "NaN or infinite"),
        ([[1.0, 2.0]], 1, "1-D"),
        ([1.0, 2.0], -1, ">= 0"),
    ],
)
def test_optimal_client_probs_rejects(norms: object, m: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        optimal_client_probs(norms, m)  # type: ignore[arg-type]


# --- mmfl_probs ----------------------------------------------------------------


def test_mmfl_probs_hand_computed() -> None:
    # Totals M = (1, 1, 1, 10): OCS gives q = (1/3, 1/3, 1/3, 1), split by norm.
    norms = np.array([[0.5, 0.5], [1.0, 0.0], [0.25, 0.75], [4.0, 6.0]])
    expected = np.array([[1 / 6, 1 / 6], [1 / 3, 0.0], [1 / 12, 1 / 4], [0.4, 0.6]])
    np.testing.assert_allclose(mmfl_probs(norms, 2), expected)


def test_mmfl_probs_with_one_model_is_ocs() -> None:
    norms = np.random.default_rng(10).lognormal(size=50)
    np.testing.assert_allclose(
        mmfl_probs(norms[:, None], 7)[:, 0], optimal_client_probs(norms, 7)
    )


@settings(max_examples=200, deadline=None)
@given(norms=norm_matrices, data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_mmfl_probs_constraints_and_optimality(
    norms: NDArray[np.float64], data: st.DataObject, seed: int
) -> None:
    clients, models = norms.shape
    m = data.draw(st.integers(0, clients))
    probs = mmfl_probs(norms, m)
    assert probs.shape == norms.shape
    assert np.all(probs >= 0)
    assert np.all(probs[norms == 0] == 0)
    assert np.all(probs.sum(axis=1) <= 1 + 1e-12)
    active_clients = np.count_nonzero(norms.sum(axis=1))
    assert probs.sum() == pytest.approx(min(m, active_clients), rel=1e-12, abs=1e-12)

    best = estimator_variance(norms, probs)
    rng = np.random.default_rng(seed)
    alternatives = [np.full(norms.shape, m / (clients * models))]
    for _ in range(10):
        client_probs = capped_inclusion_probs(rng.exponential(size=clients), m)
        split = rng.dirichlet(np.ones(models), size=clients)
        random_probs = client_probs[:, None] * split
        mixing = rng.uniform()
        alternatives += [random_probs, mixing * probs + (1 - mixing) * random_probs]
    for alternative in alternatives:
        assert np.all(alternative.sum(axis=1) <= 1 + 1e-12)
        assert no_worse_than(best, estimator_variance(norms, alternative))


@pytest.mark.parametrize(
    ("norms", "m", "message"),
    [
        ([1.0, 2.0], 1, "2-D"),
        ([[1.0, -2.0]], 1, "negative"),
        ([[1.0, np.nan]], 1, "NaN"),
        ([[1.0, 2.0]], -3, ">= 0"),
    ],
)
def test_mmfl_probs_rejects(norms: object, m: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mmfl_probs(norms, m)  # type: ignore[arg-type]


# --- assign_models -------------------------------------------------------------


def test_assign_models_frequencies() -> None:
    probs = np.array(
        [
            [0.1, 0.2, 0.3],
            [0.0, 0.5, 0.5],  # never idles
            [0.0, 0.0, 0.0],  # always idles
            [0.02, 0.0, 0.9],
            [1 / 3, 1 / 3, 1 / 3 + 1e-12],  # rounding above 1 is tolerated
        ]
    )
    draws = 40_000
    # Clients draw independently, so stacking draws copies of the clients is
    # draws independent rounds in one call.
    outcomes = assign_models(np.tile(probs, (draws, 1)), np.random.default_rng(11))
    outcomes = outcomes.reshape(draws, probs.shape[0])
    for model in range(probs.shape[1]):
        frequencies = np.mean(outcomes == model, axis=0)
        target = probs[:, model]
        assert np.all(np.abs(frequencies - target) <= binomial_tolerance(target, draws))
    idle_frequencies = np.mean(outcomes == -1, axis=0)
    idle_target = np.clip(1 - probs.sum(axis=1), 0, 1)
    assert np.all(
        np.abs(idle_frequencies - idle_target) <= binomial_tolerance(idle_target, draws)
    )


@pytest.mark.parametrize(
    ("probs", "message"),
    [
        ([[0.6, 0.5]], "at most 1"),
        ([[1.2, 0.0]], r"\[0, 1\]"),
        ([[-0.1, 0.5]], r"\[0, 1\]"),
        ([[np.nan, 0.5]], "NaN"),
        ([0.2, 0.5], "2-D"),
    ],
)
def test_assign_models_rejects(probs: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        assign_models(probs, np.random.default_rng(0))  # type: ignore[arg-type]


# --- estimator_variance --------------------------------------------------------


def test_estimator_variance_hand_computed() -> None:
    # 2^2 (1/0.5 - 1) + 0 + 1^2 (1/1 - 1) = 4
    assert estimator_variance([2.0, 0.0, 1.0], [0.5, 0.0, 1.0]) == pytest.approx(4.0)
    assert estimator_variance([[3.0, 1.0]], [[0.25, 0.5]]) == pytest.approx(28.0)
    assert estimator_variance([1.0, 1.0], [0.0, 1.0]) == float("inf")


def test_estimator_variance_matches_monte_carlo() -> None:
    rng = np.random.default_rng(12)
    updates = rng.normal(size=(6, 3)) * rng.lognormal(size=(6, 1))
    probs = np.array([0.1, 0.3, 0.5, 0.7, 0.9, 1.0])
    draws = 40_000
    selected = poisson_sample(np.tile(probs, draws), rng)
    participation = np.zeros(draws * probs.size)
    participation[selected] = 1.0
    weights = participation.reshape(draws, probs.size) / probs
    squared_errors = np.sum((weights @ updates - updates.sum(axis=0)) ** 2, axis=1)
    expected = estimator_variance(np.linalg.norm(updates, axis=1), probs)
    standard_error = squared_errors.std() / np.sqrt(draws)
    assert abs(squared_errors.mean() - expected) <= Z * standard_error


@pytest.mark.parametrize(
    ("norms", "probs", "message"),
    [
        ([1.0, 2.0], [0.5], "same shape"),
        ([[1.0, 2.0]], [0.5, 0.5], "2-D"),
        ([1.0, -2.0], [0.5, 0.5], "negative"),
        ([1.0, 2.0], [0.5, 1.5], r"\[0, 1\]"),
    ],
)
def test_estimator_variance_rejects(norms: object, probs: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        estimator_variance(norms, probs)  # type: ignore[arg-type]


# --- aocs_probs ----------------------------------------------------------------


def test_aocs_probs_hand_computed() -> None:
    # p = min(1, 2 u / 13) = (2/13, 2/13, 2/13, 1); C = (2 - 4 + 3) / (6/13)
    # = 13/6 brings the small ones to 1/3, the exact OCS; then C = 1 stops.
    norms = [1.0, 1.0, 1.0, 10.0]
    np.testing.assert_allclose(
        aocs_probs(norms, 2, max_iterations=0), [2 / 13, 2 / 13, 2 / 13, 1.0]
    )
    np.testing.assert_allclose(aocs_probs(norms, 2), optimal_client_probs(norms, 2))


def test_aocs_probs_degenerate_inputs() -> None:
    assert np.array_equal(aocs_probs([0.0, 0.0], 1), [0.0, 0.0])
    np.testing.assert_allclose(aocs_probs([0.0, 5.0, 0.0], 2), [0.0, 1.0, 0.0])
    np.testing.assert_allclose(aocs_probs([1.0, 3.0], 4), [1.0, 1.0])


@settings(max_examples=200, deadline=None)
@given(norms=norm_vectors, data=st.data())
def test_aocs_probs_stays_within_budget_and_converges_to_ocs(
    norms: NDArray[np.float64], data: st.DataObject
) -> None:
    m = data.draw(st.integers(0, norms.size))
    previous = aocs_probs(norms, m, max_iterations=0)
    for iterations in range(1, 6):
        probs = aocs_probs(norms, m, max_iterations=iterations)
        assert np.all((probs >= 0) & (probs <= 1))
        assert probs.sum() <= m * (1 + 1e-12)
        assert np.all(probs >= previous * (1 - 1e-12))
        assert estimator_variance(norms, probs) <= estimator_variance(
            norms, previous
        ) * (1 + 1e-12)
        previous = probs
    np.testing.assert_allclose(
        aocs_probs(norms, m, max_iterations=norms.size + 1),
        optimal_client_probs(norms, m),
        rtol=1e-9,
        atol=1e-12,
    )


@pytest.mark.parametrize(
    ("norms", "m", "max_iterations", "message"),
    [
        ([1.0, -1.0], 1, 4, "negative"),
        ([1.0, 2.0], -1, 4, ">= 0"),
        ([1.0, 2.0], 1, -2, "max_iterations"),
    ],
)
def test_aocs_probs_rejects(
    norms: object, m: int, max_iterations: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        aocs_probs(norms, m, max_iterations)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "call",
    [
        lambda: optimal_client_probs([1.0, 2.0], 0.5),  # type: ignore[arg-type]
        lambda: aocs_probs([1.0, 2.0], 1, 2.5),  # type: ignore[arg-type]
    ],
)
def test_a_count_of_the_wrong_type_raises_type_error(
    call: Callable[[], object],
) -> None:
    with pytest.raises(TypeError, match="must be an int"):
        call()
