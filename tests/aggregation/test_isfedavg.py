"""ISFedAvg's pure maths: alpha_k, the eq. 28 update, realized probabilities, eq. 22."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from flwr_importance.aggregation.isfedavg import (
    client_importance,
    local_gradient_variance,
    model_variability_weight,
    realized_normalized_probs,
    update_client_probs,
)
from flwr_importance.sampling.pips import systematic_sample

#: Standard errors allowed between a Monte Carlo mean and its expectation.
Z = 4.0


def test_model_variability_weight_is_three_plus_six_over_eb() -> None:
    np.testing.assert_allclose(
        model_variability_weight([1, 2, 5], [1, 3, 10]), [9.0, 4.0, 3.12]
    )
    with pytest.raises(ValueError, match=">= 1"):
        model_variability_weight([0], [1])
    with pytest.raises(ValueError, match="shape"):
        model_variability_weight([1, 2], [1])


def test_client_importance_is_sqrt_of_sigma2_plus_alpha_g2() -> None:
    importances = client_importance([1.0, 0.0], [2.0, 4.0], [1, 2], [1, 3])
    np.testing.assert_allclose(importances, [np.sqrt(1 + 9 * 2), np.sqrt(4 * 4)])
    with pytest.raises(ValueError, match="negative"):
        client_importance([-1.0], [1.0], [1], [1])
    with pytest.raises(ValueError, match="NaN"):
        client_importance([1.0], [np.nan], [1], [1])


def test_eq28_update_shares_the_participants_total_by_importance() -> None:
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    # Participants 1 and 3 hold 0.6 together; importances sqrt(0 + 9*1) = 3 and
    # sqrt(7 + 4.5*2)= 4 (E=2, B=2 gives alpha = 4.5).
    updated = update_client_probs(
        probs, [3, 1], [7.0, 0.0], [2.0, 1.0], [2, 1], [2, 1], min_relative_prob=0.0
    )
    np.testing.assert_allclose(updated, [0.1, 0.6 * 3 / 7, 0.3, 0.6 * 4 / 7])
    assert updated.sum() == pytest.approx(1.0, abs=1e-15)
    np.testing.assert_array_equal(probs, [0.1, 0.2, 0.3, 0.4])  # not modified


def test_eq28_update_floors_then_renormalizes() -> None:
    probs = np.full(4, 0.25)
    # Participant 0 has importance 0, participant 1 importance 1: before the
    # floor they get 0 and 0.5; the floor lifts 0 to 0.5/4 = 0.125.
    updated = update_client_probs(
        probs, [0, 1], [0.0, 1.0], [0.0, 0.0], [1, 1], [1, 1], min_relative_prob=0.5
    )
    floored = np.array([0.125, 0.5, 0.25, 0.25])
    np.testing.assert_allclose(updated, floored / floored.sum())
    assert updated.sum() == pytest.approx(1.0, abs=1e-15)
    assert updated.min() > 0


def test_eq28_update_keeps_probs_when_every_importance_is_zero() -> None:
    probs = np.array([0.1, 0.2, 0.7])
    updated = update_client_probs(
        probs, [0, 2], [0.0, 0.0], [0.0, 0.0], [1, 1], [1, 1], min_relative_prob=0.0
    )
    np.testing.assert_allclose(updated, probs)


@pytest.mark.parametrize(
    ("participants", "sigma2", "message"),
    [
        ([0, 0], [1.0, 1.0], "repeated"),
        ([5], [1.0], "range"),
        ([0, 1], [1.0], "sets of statistics"),
    ],
)
def test_eq28_update_rejects_bad_input(
    participants: list[int], sigma2: list[float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        update_client_probs(
            [0.5, 0.5],
            participants,
            sigma2,
            [0.0] * len(sigma2),
            [1] * len(sigma2),
            [1] * len(sigma2),
        )


def test_realized_probs_equal_targets_without_capping_and_capped_otherwise() -> None:
    np.testing.assert_allclose(
        realized_normalized_probs([0.1, 0.2, 0.3, 0.4], 2), [0.1, 0.2, 0.3, 0.4]
    )
    # 2 * 0.7 > 1: unit 0 is always included, the other unit is one of the three.
    np.testing.assert_allclose(
        realized_normalized_probs([0.7, 0.1, 0.1, 0.1], 2), [0.5, 1 / 6, 1 / 6, 1 / 6]
    )
    with pytest.raises(ValueError, match=">= 1"):
        realized_normalized_probs([0.5, 0.5], 0)


def test_horvitz_thompson_mean_is_unbiased_with_realized_probs_under_capping() -> None:
    # The strategy sends the realized p_k: (1/L) sum_{k in S} x_k / (K p_k) is
    # then unbiased for (1/K) sum_k x_k even where L p_k was capped.
    target_probs = np.array([0.45, 0.2, 0.15, 0.1, 0.05, 0.05])
    values = np.array([5.0, -1.0, 2.0, 0.5, 3.0, -4.0])
    num_clients, sample_size = target_probs.size, 3
    realized = realized_normalized_probs(target_probs, sample_size)
    assert realized[0] < target_probs[0]  # 3 * 0.45 was capped at 1
    rng = np.random.default_rng(28)
    draws = 15_000
    estimates = np.empty(draws)
    for draw in range(draws):
        chosen = systematic_sample(sample_size * realized, rng)
        estimates[draw] = np.mean(values[chosen] / (num_clients * realized[chosen]))
    standard_error = estimates.std() / np.sqrt(draws)
    assert abs(estimates.mean() - values.mean()) <= Z * standard_error
    # Dividing by the uncapped targets would miss by far more than that.
    biased = np.sum(sample_size * realized * values / (num_clients * target_probs))
    assert abs(biased / sample_size - values.mean()) > 2 * Z * standard_error


def test_local_gradient_variance_fills_unseen_with_the_mean_seen() -> None:
    probs = np.array([0.5, 0.25, 0.25])
    norms = np.array([1.0, np.nan, 3.0])
    seen = np.array([True, False, True])
    # Unseen sample 1 takes the mean squared norm (1 + 9) / 2 = 5.
    expected = 6 / (2 * 1 * 9) * (1 / 0.5 + 5 / 0.25 + 9 / 0.25)
    assert local_gradient_variance(probs, norms, seen, 2, 1) == pytest.approx(expected)
    with pytest.raises(ValueError, match="no sample"):
        local_gradient_variance(probs, norms, np.zeros(3, bool), 2, 1)
    with pytest.raises(ValueError, match="positive"):
        local_gradient_variance([1.0, 0.0, 0.0], norms, seen, 2, 1)


def test_isfedavg_maths_imports_no_flower_and_no_torch() -> None:
    code = (
        "import sys, flwr_importance.aggregation.isfedavg;"
        "print(sorted(m for m in ('flwr', 'torch') if m in sys.modules))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert output.stdout.strip() == "[]"
