"""Algorithm 2 above the exact-Ward switch: the two-level clustering.

The switch (``EXACT_WARD_LIMIT``), the invariants of Algorithm 2 on the
two-level path, the partition it finds on separated clusters against exact
Ward's, its memory (no ``N x N`` array), and the representative-gradient
state across the switch.  Monte Carlo tolerances are 4 standard errors
computed from the exact distribution matrix and the number of draws.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy.cluster.hierarchy import linkage

from flwr_importance.sampling import clustered as clustered_module
from flwr_importance.sampling.clustered import (
    EXACT_WARD_LIMIT,
    clustered_distributions_by_similarity,
    clustered_distributions_from_distances,
    sample_from_distributions,
)
from flwr_importance.sampling.distances import DISTANCES, Distance, pairwise_distances
from flwr_importance.sampling.representatives import RepresentativeGradients
from flwr_importance.sampling.scale.two_level import (
    _kmeans_plus_plus,
    capacity_blocks,
    weighted_ward_linkage,
)
from flwr_importance.strategies.clustered import ClusteredSampling
from tests.strategies.test_clustered import make_grid, run_rounds

EXACT = 1e-12


def assert_valid_distributions(
    distributions: NDArray[np.float64], sizes: NDArray[np.int64], m: int
) -> None:
    """Proposition 1 exactly, plus the dedicated rows of heavy clients."""
    assert distributions.shape == (m, sizes.size)
    assert np.all(distributions >= 0) and np.all(distributions <= 1)
    np.testing.assert_allclose(distributions.sum(axis=1), 1.0, rtol=0, atol=EXACT)
    np.testing.assert_allclose(
        distributions.sum(axis=0), m * sizes / sizes.sum(), rtol=0, atol=EXACT
    )
    full_rows = (m * sizes) // sizes.sum()
    np.testing.assert_array_equal((distributions == 1.0).sum(axis=0), full_rows)


def separated_groups(
    groups: int, per_group: int, rng: np.random.Generator, dim: int = 64
) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
    """Shuffled gradients clustered tightly around ``groups`` random centres."""
    centres = rng.standard_normal((groups, dim))
    labels = rng.permutation(np.repeat(np.arange(groups), per_group))
    return centres[labels] + 0.01 * rng.standard_normal((labels.size, dim)), labels


def test_the_switch_is_stated_and_exact_ward_runs_up_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert EXACT_WARD_LIMIT == 2_000
    assert ClusteredSampling(clients_per_round=5).exact_ward_limit == EXACT_WARD_LIMIT
    rng = np.random.default_rng(0)
    sizes, grads = rng.integers(1, 50, 40), rng.standard_normal((40, 8))
    exact = clustered_distributions_from_distances(sizes, pairwise_distances(grads), 4)
    calls = []
    original = clustered_module.two_level_tree

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(clustered_module, "two_level_tree", spy)
    at_limit = clustered_distributions_by_similarity(
        sizes, grads, 4, exact_ward_limit=40
    )
    np.testing.assert_array_equal(at_limit, exact)
    assert calls == []
    clustered_distributions_by_similarity(sizes, grads, 4, exact_ward_limit=39)
    assert calls == [1]


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("zero_fraction", [0.0, 0.5, 1.0])
def test_two_level_distributions_keep_every_invariant(
    distance: Distance, zero_fraction: float
) -> None:
    for seed in range(6):
        rng = np.random.default_rng(seed)
        clients = int(rng.integers(30, 400))
        m = int(rng.integers(1, 40))
        # Heavy-tailed sizes: clients with m p_i >= 1 own whole distributions.
        sizes = np.maximum(rng.pareto(1.0, clients) * 10, 0).astype(np.int64)
        sizes[0] += 1
        grads = rng.integers(-2, 3, (clients, 6)).astype(np.float64)
        grads[rng.random(clients) < zero_fraction] = 0.0
        distributions = clustered_distributions_by_similarity(
            sizes, grads, m, distance, exact_ward_limit=0, seed=seed
        )
        assert_valid_distributions(distributions, sizes, m)


@pytest.mark.parametrize("distance", DISTANCES)
def test_two_level_recovers_the_partition_exact_ward_finds(distance: Distance) -> None:
    # 20 separated groups of 30 equal clients, m = 20: each group weighs one
    # distribution, so exact Ward gives one group per distribution.
    rng = np.random.default_rng(1)
    grads, labels = separated_groups(20, 30, rng)
    sizes = np.full(labels.size, 7)
    exact = clustered_distributions_by_similarity(sizes, grads, 20, distance)
    scalable = clustered_distributions_by_similarity(
        sizes, grads, 20, distance, exact_ward_limit=0
    )
    for distributions in (exact, scalable):
        supports = {frozenset(np.flatnonzero(row).tolist()) for row in distributions}
        assert supports == {
            frozenset(np.flatnonzero(labels == group).tolist()) for group in range(20)
        }
    np.testing.assert_allclose(np.sort(scalable, axis=0), np.sort(exact, axis=0))


def test_two_level_draws_match_the_md_shares_by_monte_carlo() -> None:
    rng = np.random.default_rng(5)
    clients, m, rounds = 300, 12, 4000
    sizes = rng.integers(1, 100, clients)
    grads, _ = separated_groups(6, 50, rng)
    distributions = clustered_distributions_by_similarity(
        sizes, grads, m, exact_ward_limit=0
    )
    counts = np.zeros(clients)
    for _ in range(rounds):
        counts += np.bincount(
            sample_from_distributions(distributions, rng), minlength=clients
        )
    variance = np.sum(distributions * (1 - distributions), axis=0)
    standard_error = np.sqrt(variance / rounds)
    expected = m * sizes / sizes.sum()
    assert np.all(np.abs(counts / rounds - expected) <= 4 * standard_error + 1e-12)


def test_weighted_ward_is_scipy_ward_on_the_repeated_points() -> None:
    rng = np.random.default_rng(2)
    points = rng.standard_normal((25, 3))
    weights = rng.integers(1, 4, 25)
    np.testing.assert_allclose(
        np.sort(weighted_ward_linkage(points, np.ones(25))[:, 2]),
        np.sort(linkage(points, "ward")[:, 2]),
    )
    # A point of weight w is w clients at the same place: their merges at
    # height 0 come first, then the same tree as the weighted one.
    repeated = np.repeat(points, weights, axis=0)
    heights = np.sort(linkage(repeated, "ward")[:, 2])[-24:]
    np.testing.assert_allclose(
        np.sort(weighted_ward_linkage(points, weights)[:, 2]), heights, atol=1e-9
    )


def test_kmeans_plus_plus_draws_by_squared_distance_and_never_a_duplicate() -> None:
    # Points 0 and 1 coincide, 2 and 3 lie at 1 and 3 on the line: after a
    # uniform first centre, the second is drawn with probability proportional
    # to its squared distance to the first, and a copy of a centre never.
    points = np.array([[0.0, 5.0], [0.0, 5.0], [1.0, 5.0], [3.0, 5.0]], np.float32)
    squared = np.sum((points[:, None, :] - points[None, :, :]) ** 2, axis=2)
    expected = squared / squared.sum(axis=1, keepdims=True) / len(points)
    runs = 4000
    counts = np.zeros((len(points), len(points)))
    for seed in range(runs):
        centres = _kmeans_plus_plus(points, 2, np.random.default_rng(seed))
        first, second = (
            int(np.flatnonzero(np.all(points == c, axis=1))[0]) for c in centres
        )
        counts[first, second] += 1
    # A centre at point 0 or 1 is the same centre: fold their rows and columns.
    fold = np.array([[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    observed = fold @ counts @ fold.T / runs
    target = fold @ expected @ fold.T
    assert observed[0, 0] == 0.0
    tolerance = 4 * np.sqrt(target * (1 - target) / runs)
    assert np.all(np.abs(observed - target) <= tolerance + EXACT)


def test_capacity_blocks_fit_and_stay_in_their_group() -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        total = int(rng.integers(2, 50))
        units = rng.integers(0, total, 200)
        groups = rng.integers(0, 5, 200)
        blocks = capacity_blocks(groups, units, total)
        assert np.bincount(blocks, weights=units).max() <= total
        for block in np.unique(blocks):
            assert np.unique(groups[blocks == block]).size == 1


def test_no_n_by_n_array_above_the_switch() -> None:
    # 20,000 clients: an N x N float64 matrix would take 3.2 GB.
    clients, m = 20_000, 100
    rng = np.random.default_rng(4)
    grads, _ = separated_groups(50, clients // 50, rng, dim=16)
    sizes = rng.integers(1, 100, clients)
    tracemalloc.start()
    try:
        distributions = clustered_distributions_by_similarity(
            sizes, grads.astype(np.float32), m
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The (m, N) output and its integer unit table: 16 MB each.
    assert peak < 150 * 2**20
    assert_valid_distributions(distributions, sizes, m)


def test_the_gradient_state_keeps_no_matrix_above_the_switch() -> None:
    state = RepresentativeGradients("arccos", None, seed=0, matrix_limit=50)
    state.align(list(range(20_000)))
    assert not state.keeps_matrix
    state.update({7: np.ones(4), 8: -np.ones(4)})
    assert state.nbytes == 20_000 * 4 * 4
    assert state.rows().shape == (20_000, 4)
    with pytest.raises(ValueError, match="no distance matrix above 50 nodes"):
        state.distances()


@pytest.mark.parametrize("distance", DISTANCES)
def test_incremental_distances_equal_recomputation_across_the_switch(
    distance: Distance,
) -> None:
    # Rows are updated a few at a time; the node count crosses the matrix
    # limit and comes back: the kept matrix is the full recomputation.
    rng = np.random.default_rng(6)
    state = RepresentativeGradients(distance, 16, seed=0, matrix_limit=30)
    for step, count in enumerate([25, 25, 40, 28, 28, 28]):
        # Nodes leave from the front and join at the back.
        nodes = list(range(step, step + count))
        state.align(nodes)
        updated = rng.choice(nodes, size=5, replace=False)
        state.update({int(node): rng.standard_normal(50) for node in updated})
        if not state.keeps_matrix:
            continue
        incremental = state.distances().copy()
        np.testing.assert_allclose(
            incremental,
            pairwise_distances(state.rows(), distance),
            rtol=1e-5,
            atol=1e-5,
        )


def test_the_strategy_runs_the_two_level_path_above_its_limit() -> None:
    # 100 one-digit nodes, limit 50: no matrix, and every round's
    # distributions keep the MD shares.
    strategy = ClusteredSampling(clients_per_round=10, exact_ward_limit=50, seed=0)
    grid = make_grid([20] * 100)
    _, draws, metrics = run_rounds(strategy, grid, 3)
    assert not strategy.gradients.keeps_matrix
    assert strategy.gradients.nbytes == strategy.gradients.rows().nbytes
    assert all(sum(round_draws.values()) == 10 for round_draws in draws)
    assert all(round_metrics["aggregated-draws"] == 10 for round_metrics in metrics)
