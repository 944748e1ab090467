"""Monte Carlo: FOLB's global-gradient estimate is unbiased where the paper says so.

The paper (eq. 10) calls ``gS2`` "an unbiased estimate of" the global gradient.
For the ``1/N`` objective (``weighting="uniform"``) the multiset mean is that
estimate. For the paper's ``n_k / n`` objective the estimate is the ratio
``sum n_j g_j / sum n_j``, whose scale cancels in the weights; its unbiased
counterpart under uniform draws is ``(N / (K n)) sum_{j in S} n_j g_j``, the
estimate times ``N sum_{j in S} n_j / (K n)``. Draws come from the strategy's
own :func:`uniform_client_set`, with and without replacement (both include a
device ``K / N`` times in expectation).

Tolerance: per coordinate, 4 standard errors of the mean of ``DRAWS``
independent estimates (the sample standard deviation over ``sqrt(DRAWS)``).
"""

from __future__ import annotations

import numpy as np
import pytest

from flwr_importance.aggregation.folb import estimated_global_gradient
from flwr_importance.sampling.schedule import uniform_client_set

NUM_DEVICES = 8
K = 3
DRAWS = 5_000
RNG = np.random.default_rng(2021)
# Unequal sizes and gradients that differ with them: the n_k-weighted and the
# plain mean of the gradients are far apart.
SAMPLES = np.array([2.0, 5.0, 9.0, 30.0, 60.0, 4.0, 120.0, 15.0])
GRADIENTS = RNG.normal(size=(NUM_DEVICES, 3)) + np.outer(np.log(SAMPLES), [1, -1, 0])
NODES = list(range(100, 100 + NUM_DEVICES))


def estimates(replace: bool, weighting: str) -> np.ndarray:
    """One estimate of the global gradient per round, ``DRAWS`` rounds."""
    rows = []
    for server_round in range(DRAWS):
        draws = uniform_client_set(
            NODES, K, seed=7, server_round=server_round, replace=replace
        )
        devices, multiplicities = np.unique(
            [node - NODES[0] for node in draws], return_counts=True
        )
        if weighting == "uniform":
            rows.append(
                estimated_global_gradient(list(GRADIENTS[devices]), multiplicities)
            )
            continue
        ratio = estimated_global_gradient(
            list(GRADIENTS[devices]), multiplicities, sample_counts=SAMPLES[devices]
        )
        drawn_samples = multiplicities @ SAMPLES[devices]
        rows.append(ratio * NUM_DEVICES * drawn_samples / (K * SAMPLES.sum()))
    return np.array(rows)


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("weighting", ["samples", "uniform"])
def test_the_global_gradient_estimate_is_unbiased(
    replace: bool, weighting: str
) -> None:
    values = estimates(replace, weighting)
    weights = SAMPLES / SAMPLES.sum() if weighting == "samples" else None
    truth = np.average(GRADIENTS, axis=0, weights=weights)
    other = np.average(
        GRADIENTS, axis=0, weights=None if weighting == "samples" else SAMPLES
    )
    tolerance = 4 * values.std(axis=0, ddof=1) / np.sqrt(DRAWS)
    np.testing.assert_array_less(np.abs(values.mean(axis=0) - truth), tolerance)
    # The test has power: an estimate of the other objective's gradient would
    # miss by several tolerances in every coordinate.
    assert np.all(np.abs(other - truth) > 3 * tolerance)
