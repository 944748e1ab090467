"""FedSampling's pure maths: keep probability, Bernoulli sampling, server step."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from flwr_importance.aggregation.fedsampling import server_update
from flwr_importance.sampling.fedsampling import bernoulli_keep, keep_probability
from flwr_importance.sampling.privacy import estimate_total_size, privatize_size


def test_keep_probability_is_k_over_n_tilde() -> None:
    assert keep_probability(32, 128.0) == 0.25
    assert keep_probability(32, 32.0) == 1.0


def test_bernoulli_keep_count_is_binomial() -> None:
    rng = np.random.default_rng(0)
    num_samples, probability, draws = 200, 0.1, 2_000
    counts = np.array(
        [bernoulli_keep(num_samples, probability, rng).sum() for _ in range(draws)]
    )
    expected = num_samples * probability
    standard_error = math.sqrt(expected * (1 - probability) / draws)
    assert abs(counts.mean() - expected) < 4 * standard_error
    assert bernoulli_keep(0, 0.5, rng).shape == (0,)
    assert bernoulli_keep(50, 1.0, rng).all()


def test_samples_per_round_average_k_through_the_private_estimate() -> None:
    """Size query, estimate, clamp, Bernoulli keep: about ``K`` samples a round.

    Conditioned on the estimate the count has mean ``K N / N_tilde``; averaging
    over rounds adds the Jensen bias ``E[N / N_tilde] - 1 ~ Var(N_tilde) / N^2``
    (second order), which the tolerance includes next to 4 standard errors.
    """
    rng = np.random.default_rng(1)
    sizes = rng.integers(1, 99, size=400)  # below M - 1: nothing is clipped
    max_size, epsilon, samples_per_round, rounds = 100, 5.0, 256, 600
    kept_per_round, estimates = [], []
    for _ in range(rounds):
        replies = [privatize_size(int(n), max_size, epsilon, rng) for n in sizes]
        estimate = max(
            estimate_total_size(replies, max_size, epsilon), samples_per_round
        )
        probability = keep_probability(samples_per_round, estimate)
        kept_per_round.append(
            sum(bernoulli_keep(int(n), probability, rng).sum() for n in sizes)
        )
        estimates.append(estimate)
    kept = np.array(kept_per_round, dtype=float)
    relative_variance = np.var(estimates) / sizes.sum() ** 2
    tolerance = 4 * kept.std(ddof=1) / math.sqrt(rounds) + (
        2 * samples_per_round * relative_variance
    )
    assert abs(kept.mean() - samples_per_round) < tolerance


def test_server_update_descends_along_the_summed_gradients() -> None:
    model = np.array([1.0, -2.0, 0.5])
    updates = [np.array([0.5, 0.0, 1.0]), np.array([0.5, 1.0, -1.0])]
    np.testing.assert_allclose(
        server_update(model, updates, server_lr=0.1), [0.9, -2.1, 0.5]
    )
    np.testing.assert_array_equal(server_update(model, [], server_lr=0.1), model)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: keep_probability(0, 10.0), "samples_per_round"),
        (lambda: keep_probability(10, 5.0), "clamp"),
        (lambda: keep_probability(10, float("nan")), "finite"),
        (lambda: bernoulli_keep(5, 1.5, np.random.default_rng()), "probability"),
        (lambda: bernoulli_keep(-1, 0.5, np.random.default_rng()), "num_samples"),
        (lambda: server_update(np.zeros(2), [np.zeros(2)], 0.0), "server_lr"),
        (lambda: server_update(np.zeros(2), [np.zeros(3)], 1.0), "shape"),
    ],
)
def test_invalid_input_raises(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()
