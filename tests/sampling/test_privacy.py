"""FedSampling's private size query: the randomized response is epsilon-LDP
(exactly and empirically) and the total-size estimator is unbiased.

Monte Carlo tolerances are 4 standard errors computed from the exact reply
distribution and the number of draws."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from numpy.typing import NDArray

from flwr_importance.sampling.privacy import (
    estimate_total_size,
    ldp_alpha,
    privatize_size,
    size_reply_probabilities,
)


def reply_moments(size: int, max_size: int, epsilon: float) -> tuple[float, float]:
    """Exact mean and variance of one client's reply."""
    replies = np.arange(1, max_size)
    pmf = size_reply_probabilities(size, max_size, epsilon)
    mean = float(replies @ pmf)
    return mean, float((replies - mean) ** 2 @ pmf)


def empirical_pmf(
    size: int, max_size: int, epsilon: float, draws: int, seed: int
) -> NDArray[np.float64]:
    rng = np.random.default_rng(seed)
    replies = [privatize_size(size, max_size, epsilon, rng) for _ in range(draws)]
    return np.bincount(replies, minlength=max_size)[1:] / draws


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0, 8.0])
@pytest.mark.parametrize("max_size", [3, 10, 100])
def test_alpha_matches_paper_formula(epsilon: float, max_size: int) -> None:
    expected = (math.exp(epsilon) - 1) / (math.exp(epsilon) + max_size - 2)
    assert ldp_alpha(epsilon, max_size) == pytest.approx(expected, rel=1e-12)


def test_alpha_is_finite_for_huge_epsilon() -> None:
    assert ldp_alpha(1000.0, 100) == 1.0
    assert 0 < ldp_alpha(1e-9, 100) < 1e-9


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 3.0])
@pytest.mark.parametrize("max_size", [3, 10, 100])
def test_exact_reply_distribution_is_epsilon_ldp(epsilon: float, max_size: int) -> None:
    """max over n, n', y of P(y | n) / P(y | n') is exactly e^eps (Lemma 3.2)."""
    pmfs = np.array(
        [size_reply_probabilities(size, max_size, epsilon) for size in range(max_size)]
    )
    np.testing.assert_allclose(pmfs.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    ratios = pmfs[:, None, :] / pmfs[None, :, :]
    assert ratios.max() == pytest.approx(math.exp(epsilon), rel=1e-12)


@pytest.mark.parametrize("size", [0, 1, 4, 250])
def test_reply_mean_is_what_the_estimator_assumes(size: int) -> None:
    """nhat uniform on {1..M-1} has mean M/2, so a reply has mean
    alpha n + (1 - alpha) M / 2 with n the size clipped to [1, M-1]."""
    max_size, epsilon = 100, 3.0
    assert np.arange(1, max_size).mean() == max_size / 2
    alpha = ldp_alpha(epsilon, max_size)
    clipped = min(max(size, 1), max_size - 1)
    mean, _ = reply_moments(size, max_size, epsilon)
    assert mean == pytest.approx(alpha * clipped + (1 - alpha) * max_size / 2)


def test_replies_follow_the_exact_distribution() -> None:
    """Per-reply binomial bound between observed and exact frequencies; a
    size of 0 replies like a size of 1 and a size above M - 1 like M - 1."""
    max_size, epsilon, draws = 6, 1.0, 20_000
    for seed, (size, equivalent) in enumerate([(2, 2), (0, 1), (1000, 5)]):
        observed = empirical_pmf(size, max_size, epsilon, draws, seed)
        exact = size_reply_probabilities(equivalent, max_size, epsilon)
        tolerance = 4 * np.sqrt(exact * (1 - exact) / draws)
        assert np.all(np.abs(observed - exact) <= tolerance)


def test_empirical_replies_respect_the_ldp_bound() -> None:
    """For two true sizes, P^(y | n1) <= e^eps P^(y | n2) for every reply y,
    up to 4 standard errors of P^(y | n1) - e^eps P^(y | n2)."""
    max_size, epsilon, draws = 6, 1.0, 20_000
    bound = math.exp(epsilon)
    sizes = (2, 5)
    observed = [
        empirical_pmf(size, max_size, epsilon, draws, seed=10 + size) for size in sizes
    ]
    exact = [size_reply_probabilities(size, max_size, epsilon) for size in sizes]
    for first, second in ((0, 1), (1, 0)):
        standard_error = np.sqrt(
            exact[first] * (1 - exact[first]) / draws
            + bound**2 * exact[second] * (1 - exact[second]) / draws
        )
        excess = observed[first] - bound * observed[second]
        assert np.all(excess <= 4 * standard_error)


def test_total_size_estimate_is_unbiased() -> None:
    """Many rounds of many clients (log-normal sizes, some empty, some above
    M): the mean estimate is within 4 standard errors of the sum of the
    clipped sizes, with the standard error from the exact reply variance."""
    max_size, epsilon, rounds = 100, 3.0, 1000
    rng = np.random.default_rng(20)
    sizes = np.floor(rng.lognormal(3.0, 1.5, size=100)).astype(int)
    sizes[:5] = 0
    assert sizes.max() >= max_size
    truth = np.clip(sizes, 1, max_size - 1).sum()

    estimates = np.array(
        [
            estimate_total_size(
                [privatize_size(size, max_size, epsilon, rng) for size in sizes],
                max_size,
                epsilon,
            )
            for _ in range(rounds)
        ]
    )
    alpha = ldp_alpha(epsilon, max_size)
    estimate_variance = (
        sum(reply_moments(int(size), max_size, epsilon)[1] for size in sizes) / alpha**2
    )
    assert abs(estimates.mean() - truth) <= 4 * math.sqrt(estimate_variance / rounds)
    # The sample variance agrees with the exact one as well (normal-theory
    # standard error of a variance: var * sqrt(2 / (rounds - 1))).
    assert abs(estimates.var(ddof=1) - estimate_variance) <= (
        4 * estimate_variance * math.sqrt(2 / (rounds - 1))
    )


def test_estimate_converges_to_truth_as_epsilon_grows() -> None:
    """The estimator's exact standard deviation shrinks with epsilon, and at
    a very large epsilon every reply is truthful and the estimate exact."""
    max_size = 100
    sizes = np.arange(1, 60)
    deviations = [
        math.sqrt(sum(reply_moments(int(size), max_size, epsilon)[1] for size in sizes))
        / ldp_alpha(epsilon, max_size)
        for epsilon in (1.0, 3.0, 6.0, 12.0)
    ]
    assert all(np.diff(deviations) < 0)

    rng = np.random.default_rng(21)
    replies = [privatize_size(int(size), max_size, 40.0, rng) for size in sizes]
    np.testing.assert_array_equal(replies, sizes)
    assert estimate_total_size(replies, max_size, 40.0) == pytest.approx(
        sizes.sum(), rel=1e-12
    )


def test_estimate_is_not_clamped() -> None:
    """Small replies can give a negative estimate; the caller clamps it."""
    assert estimate_total_size([1, 1, 1], 100, 1.0) < 0
    assert estimate_total_size([], 100, 1.0) == 0.0


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ldp_alpha(0.0, 100), "epsilon"),
        (lambda: ldp_alpha(-1.0, 100), "epsilon"),
        (lambda: ldp_alpha(math.nan, 100), "epsilon"),
        (lambda: ldp_alpha(math.inf, 100), "epsilon"),
        (lambda: ldp_alpha(1.0, 2), "max_size"),
        (lambda: ldp_alpha(1.0, 10.5), "max_size"),  # type: ignore[arg-type]
        (lambda: ldp_alpha(1.0, True), "max_size"),
        (lambda: privatize_size(-1, 100, 1.0, np.random.default_rng()), "size"),
        (lambda: privatize_size(2.5, 100, 1.0, np.random.default_rng()), "size"),  # type: ignore[arg-type]
        (lambda: privatize_size(5, 2, 1.0, np.random.default_rng()), "max_size"),
        (lambda: privatize_size(5, 100, 0.0, np.random.default_rng()), "epsilon"),
        (lambda: size_reply_probabilities(-3, 100, 1.0), "size"),
        (lambda: estimate_total_size([0, 5], 100, 1.0), r"\[1, 99\]"),
        (lambda: estimate_total_size([5, 100], 100, 1.0), r"\[1, 99\]"),
        (lambda: estimate_total_size([5, 2.5], 100, 1.0), "integers"),
        (lambda: estimate_total_size([5, -2], 100, 1.0), "negative"),
        (lambda: estimate_total_size([5, math.nan], 100, 1.0), "NaN"),
        (lambda: estimate_total_size([[5, 6]], 100, 1.0), "1-D"),
        (lambda: estimate_total_size([5, 6], 100, -1.0), "epsilon"),
    ],
)
def test_invalid_input_raises(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
