"""The two-level clustering kept between rounds (IncrementalTwoLevel).

Against the from-scratch two-level clustering (and exact Ward, which runs at
these sizes) on the same gradients: identical when nothing changed, valid
distributions every round, and, by Monte Carlo on the same draws (common
random numbers), class coverage and aggregation-weight variance no worse
than from scratch beyond 4 standard errors of the paired per-draw
differences.  Runtime: about 2 s.
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from flwr_importance.sampling.clustered import (
    clustered_distributions_by_similarity,
    sample_from_distributions,
)
from flwr_importance.sampling.distances import DISTANCES, Distance
from flwr_importance.sampling.scale.incremental import (
    IncrementalTwoLevel,
    clustered_distributions_incrementally,
)
from tests.strategies.test_clustered_two_level import assert_valid_distributions

CLIENTS, CLASSES, DIM, M = 600, 10, 32, 20
#: Accepted coverage loss of two levels against exact Ward, as in
#: benchmarks.sampling_overhead.
MAX_COVERAGE_LOSS = 0.05


def mixture(
    classes: NDArray[np.intp], centres: NDArray[np.float64], rng: np.random.Generator
) -> NDArray[np.float32]:
    """Each client's class centre plus noise."""
    noise = 0.5 * rng.standard_normal((classes.size, centres.shape[1]))
    return (centres[classes] + noise).astype(np.float32)


@pytest.mark.parametrize("distance", DISTANCES)
def test_nothing_changed_gives_the_from_scratch_clustering(distance: Distance) -> None:
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((CLASSES, DIM))
    grads = mixture(rng.integers(0, CLASSES, CLIENTS), centres, rng)
    grads[:50] = 0.0
    sizes = rng.integers(1, 100, CLIENTS)
    scratch = clustered_distributions_by_similarity(
        sizes, grads, M, distance, exact_ward_limit=0, seed=3
    )
    clustering = IncrementalTwoLevel(distance, seed=3)
    for changed in (None, [], []):
        incremental = clustered_distributions_incrementally(
            sizes, grads, M, clustering, changed=changed
        )
        np.testing.assert_array_equal(incremental, scratch)
    assert clustering.rebuilds == 1


@pytest.mark.parametrize("distance", DISTANCES)
def test_every_warm_round_keeps_every_invariant(distance: Distance) -> None:
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((CLASSES, DIM))
    grads = np.zeros((CLIENTS, DIM), np.float32)
    sizes = np.maximum(rng.pareto(1.0, CLIENTS) * 10, 0).astype(np.int64) + 1
    clustering = IncrementalTwoLevel(distance)
    changed = None
    for _ in range(12):
        distributions = clustered_distributions_incrementally(
            sizes, grads, M, clustering, changed=changed
        )
        assert_valid_distributions(distributions, sizes, M)
        changed = np.sort(rng.choice(CLIENTS, M, replace=False))
        grads[changed] = mixture(rng.integers(0, CLASSES, M), centres, rng)
        # Some updates are zero: those clients leave level 1.
        grads[changed[:2]] = 0.0
    # Round 1 (all zero) and round 2 (the first gradients) are cold.
    assert clustering.rebuilds == 2


def paired_statistics(
    distributions: NDArray[np.float64],
    classes: NDArray[np.intp],
    shares: NDArray[np.float64],
    seed: int,
    draws: int,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Per draw: the classes covered, and ``sum_i (omega_i - p_i)^2``.

    The second's mean is the sum of the aggregation weights' variances
    (``E omega_i = p_i``), so both are means of independent draws.
    """
    rng = np.random.default_rng(seed)
    coverage, deviation = np.empty(draws), np.empty(draws)
    for draw in range(draws):
        drawn = sample_from_distributions(distributions, rng)
        coverage[draw] = np.unique(classes[drawn]).size / CLASSES
        weights = np.bincount(drawn, minlength=classes.size) / M
        deviation[draw] = np.sum((weights - shares) ** 2)
    return coverage, deviation


def test_warm_rounds_cover_classes_and_spread_weights_as_from_scratch() -> None:
    rng = np.random.default_rng(2)
    centres = rng.standard_normal((CLASSES, 256))
    classes = rng.integers(0, CLASSES, CLIENTS)
    grads = mixture(classes, centres, rng)
    sizes = rng.integers(50, 500, CLIENTS)
    clustering = IncrementalTwoLevel()
    clustered_distributions_incrementally(sizes, grads, M, clustering, changed=None)
    # 30 rounds of M new updates, a quarter of them from clients whose data
    # (class) changed: half the clients move, the centres must follow.
    for _ in range(30):
        changed = np.sort(rng.choice(CLIENTS, M, replace=False))
        drifted = changed[: M // 4]
        classes[drifted] = rng.integers(0, CLASSES, drifted.size)
        grads[changed] = mixture(classes[changed], centres, rng)
        incremental = clustered_distributions_incrementally(
            sizes, grads, M, clustering, changed=changed
        )
    assert clustering.rebuilds == 1
    shares = sizes / sizes.sum()
    draws = 1500
    incremental_stats = paired_statistics(incremental, classes, shares, 7, draws)
    for limit, allowed in ((0, 0.0), (CLIENTS, MAX_COVERAGE_LOSS)):
        reference = clustered_distributions_by_similarity(
            sizes, grads, M, exact_ward_limit=limit
        )
        reference_stats = paired_statistics(reference, classes, shares, 7, draws)
        coverage, deviation = (
            ours - theirs
            for ours, theirs in zip(incremental_stats, reference_stats, strict=True)
        )
        assert coverage.mean() >= -allowed - 4 * coverage.std(ddof=1) / np.sqrt(draws)
        assert deviation.mean() <= 4 * deviation.std(ddof=1) / np.sqrt(draws)
