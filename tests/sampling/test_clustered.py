"""Clustered sampling: exact invariants of Algorithms 1 and 2, the draws, and
the aggregation-weight variances, checked against the paper's claims.

Monte Carlo tolerances are 4 standard errors computed from the exact
distribution matrix and the number of draws."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from flwr_importance.sampling.clustered import (
    aggregation_weight_variance,
    clustered_distributions_by_similarity,
    clustered_distributions_by_size,
    clustered_distributions_from_distances,
    md_aggregation_weight_variance,
    sample_from_distributions,
)
from flwr_importance.sampling.distances import DISTANCES, Distance, pairwise_distances
from flwr_importance.sampling.scale.sketch import project_gradients

EXACT = 1e-12


def assert_valid_distributions(
    distributions: NDArray[np.float64], sizes: NDArray[np.int64], m: int
) -> None:
    """Proposition 1 exactly, plus the dedicated rows of heavy clients."""
    shares = m * sizes / sizes.sum()
    assert distributions.shape == (m, sizes.size)
    assert not np.any(np.isnan(distributions))
    assert np.all(distributions >= 0)
    assert np.all(distributions <= 1)
    np.testing.assert_allclose(distributions.sum(axis=1), 1.0, rtol=0, atol=EXACT)
    np.testing.assert_allclose(distributions.sum(axis=0), shares, rtol=0, atol=EXACT)
    # Clients with p_i >= 1/m own floor(m p_i) distributions outright; nobody
    # else fills a distribution alone (their remainder is below M_tot).
    full_rows = (m * sizes) // sizes.sum()
    np.testing.assert_array_equal((distributions == 1.0).sum(axis=0), full_rows)


@st.composite
def sizes_and_m(draw: st.DrawFn) -> tuple[NDArray[np.int64], int]:
    """Sizes with a positive total and a valid m; small populations and wide
    size ranges make clients with p_i > 1/m frequent."""
    clients = draw(st.integers(1, 25))
    sizes = np.array(
        draw(
            st.lists(
                st.one_of(st.integers(0, 20), st.integers(0, 100_000)),
                min_size=clients,
                max_size=clients,
            ).filter(lambda values: sum(values) > 0)
        ),
        dtype=np.int64,
    )
    return sizes, draw(st.integers(1, clients))


def random_gradients(
    clients: int, rng: np.random.Generator, zero_fraction: float = 0.3
) -> NDArray[np.float64]:
    """Gradients with duplicates (coarse integers) and never-sampled zeros."""
    grads = rng.integers(-2, 3, size=(clients, 4)).astype(np.float64)
    grads[rng.random(clients) < zero_fraction] = 0.0
    return grads


def separated_groups(
    groups: int, per_group: int, rng: np.random.Generator, dim: int = 200
) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
    """Shuffled gradients clustered tightly around ``groups`` random centres."""
    centres = rng.standard_normal((groups, dim))
    labels = rng.permutation(np.repeat(np.arange(groups), per_group))
    grads = centres[labels] + 0.01 * rng.standard_normal((labels.size, dim))
    return grads, labels


# --- exact invariants -----------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(sizes_and_m())
def test_algorithm1_invariants(case: tuple[NDArray[np.int64], int]) -> None:
    sizes, m = case
    distributions = clustered_distributions_by_size(sizes, m)
    assert_valid_distributions(distributions, sizes, m)
    # Paper, Section 4: a client appears in at most floor(m p_i) + 2 rows.
    full_rows = (m * sizes) // sizes.sum()
    assert np.all((distributions > 0).sum(axis=0) <= full_rows + 2)


@settings(max_examples=100, deadline=None)
@given(
    sizes_and_m(),
    st.sampled_from(DISTANCES),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0.0, 0.3, 1.0]),
)
def test_algorithm2_invariants(
    case: tuple[NDArray[np.int64], int],
    distance: Distance,
    seed: int,
    zero_fraction: float,
) -> None:
    sizes, m = case
    grads = random_gradients(sizes.size, np.random.default_rng(seed), zero_fraction)
    distributions = clustered_distributions_by_similarity(sizes, grads, m, distance)
    assert_valid_distributions(distributions, sizes, m)


@pytest.mark.parametrize(
    "sizes, m",
    [
        ([13, 12, 5, 5, 5], 4),  # two heavy clients; greedy alone gives 1 full row
        ([100, 1, 1, 1], 3),  # one client owns two rows
        ([7, 0, 0], 2),  # one client holds all the data
        ([5, 5], 2),  # every row dedicated
        ([1], 1),
    ],
)
def test_heavy_clients_own_whole_distributions(sizes: list[int], m: int) -> None:
    counts = np.array(sizes)
    rng = np.random.default_rng(0)
    for distributions in (
        clustered_distributions_by_size(counts, m),
        clustered_distributions_by_similarity(
            counts, rng.standard_normal((counts.size, 3)), m
        ),
    ):
        assert_valid_distributions(distributions, counts, m)


def test_algorithm1_is_exact_with_awkward_sizes() -> None:
    """Sizes whose shares are not representable in binary floats."""
    sizes = np.array([3, 7, 11, 13, 17, 19, 23, 29, 31, 37] * 7)
    for m in (3, 7, 9, 30, 70):
        assert_valid_distributions(clustered_distributions_by_size(sizes, m), sizes, m)


def test_algorithm1_equal_sizes_gives_disjoint_distributions() -> None:
    """Paper, Section 6: N = 100 equal clients, m = 10: every round has 10
    distinct clients, each client in exactly one distribution."""
    distributions = clustered_distributions_by_size(np.full(100, 500), 10)
    np.testing.assert_array_equal((distributions > 0).sum(axis=0), 1)
    np.testing.assert_array_equal((distributions > 0).sum(axis=1), 10)
    np.testing.assert_allclose(distributions[distributions > 0], 0.1, atol=EXACT)
    rng = np.random.default_rng(1)
    for _ in range(1000):
        assert np.unique(sample_from_distributions(distributions, rng)).size == 10


def test_algorithm1_groups_clients_by_size() -> None:
    """Clients sorted by size fill the distributions in order: the largest
    clients share the first distribution."""
    sizes = np.array([1, 9, 2, 8, 3, 7, 4, 6, 5, 5])
    distributions = clustered_distributions_by_size(sizes, 5)
    assert set(np.flatnonzero(distributions[0])) == {1, 3}  # sizes 9 and 8


# --- Algorithm 2 --------------------------------------------------------------


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_algorithm2_separated_groups_one_group_per_distribution(
    distance: Distance, dtype: type
) -> None:
    """Paper, Section 6 (MNIST, one digit per client): 10 groups of 10 equal
    clients, m = 10.  Each group weighs exactly M_tot units, so the tree is
    cut into the 10 groups and each distribution is one group, uniformly:
    every round draws one client of every group."""
    rng = np.random.default_rng(2)
    grads, labels = separated_groups(10, 10, rng)
    distributions = clustered_distributions_by_similarity(
        np.full(100, 500),
        grads.astype(dtype),
        10,
        distance,
    )
    for row in distributions:
        support = np.flatnonzero(row)
        assert np.unique(labels[support]).size == 1
        assert support.size == 10
        np.testing.assert_allclose(row[support], 0.1, atol=EXACT)
    for _ in range(200):
        drawn = sample_from_distributions(distributions, rng)
        assert np.unique(labels[drawn]).size == 10


@pytest.mark.parametrize("distance", DISTANCES)
def test_algorithm2_zero_gradients_grouped_together(distance: Distance) -> None:
    """Clients never sampled (zero gradient) are grouped together, as the
    paper intends, without NaN: with 9 separated groups and 10 zero clients
    of equal size, the zero clients form one distribution."""
    rng = np.random.default_rng(3)
    grads, labels = separated_groups(10, 10, rng)
    never_sampled = labels == 0
    grads[never_sampled] = 0.0
    distributions = clustered_distributions_by_similarity(
        np.full(100, 20),
        grads,
        10,
        distance,
    )
    assert not np.any(np.isnan(distributions))
    supports = [set(np.flatnonzero(row)) for row in distributions]
    assert set(np.flatnonzero(never_sampled)) in supports


@pytest.mark.parametrize("distance", DISTANCES)
def test_algorithm2_all_zero_gradients(distance: Distance) -> None:
    sizes = np.array([1, 2, 3, 4, 5, 6, 7, 8])
    distributions = clustered_distributions_by_similarity(
        sizes,
        np.zeros((8, 5)),
        3,
        distance,
    )
    assert_valid_distributions(distributions, sizes, 3)


def reference_distance(
    a: NDArray[np.float64], b: NDArray[np.float64], name: str
) -> float:
    """One pair at a time, as the authors' reference implementation does."""
    if name == "l1":
        return float(np.sum(np.abs(a - b)))
    if name == "l2":
        return float(np.sqrt(np.sum((a - b) ** 2)))
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    if norms == 0:  # the documented convention for zero gradients
        return 0.0 if not a.any() and not b.any() else np.pi / 2
    return float(np.arccos(np.clip(a @ b / norms, -1, 1)))


@pytest.mark.parametrize("distance", DISTANCES)
def test_pairwise_distances_match_a_pair_loop(distance: Distance) -> None:
    rng = np.random.default_rng(10)
    grads = rng.standard_normal((12, 40))
    grads[[2, 7]] = 0.0
    grads[5] = 3 * grads[4]  # same direction, different length
    expected = np.array(
        [[reference_distance(a, b, distance) for b in grads] for a in grads]
    )
    distances = pairwise_distances(grads, distance)
    off_diagonal = ~np.eye(12, dtype=bool)
    # Gram-matrix cosines near 1 lose digits in arccos: 1e-6 rad is still far
    # below any distance the clustering separates.
    np.testing.assert_allclose(
        distances[off_diagonal], expected[off_diagonal], rtol=1e-9, atol=1e-6
    )
    np.testing.assert_array_equal(distances, distances.T)


def test_algorithm2_from_precomputed_distances_is_the_same() -> None:
    rng = np.random.default_rng(11)
    sizes = rng.integers(1, 100, 30)
    grads = rng.standard_normal((30, 20))
    for distance in DISTANCES:
        np.testing.assert_array_equal(
            clustered_distributions_by_similarity(sizes, grads, 4, distance),
            clustered_distributions_from_distances(
                sizes, pairwise_distances(grads, distance), 4
            ),
        )


def test_algorithm2_is_deterministic() -> None:
    rng = np.random.default_rng(4)
    sizes = rng.integers(1, 100, 40)
    grads = rng.standard_normal((40, 30))
    first = clustered_distributions_by_similarity(sizes, grads, 6)
    np.testing.assert_array_equal(
        first, clustered_distributions_by_similarity(sizes, grads, 6)
    )


# --- draws and aggregation weights -------------------------------------------


def count_draws(
    distributions: NDArray[np.float64], rounds: int, seed: int
) -> NDArray[np.int64]:
    """Times each client is drawn, per round: shape (rounds, N)."""
    rng = np.random.default_rng(seed)
    clients = distributions.shape[1]
    return np.stack(
        [
            np.bincount(
                sample_from_distributions(distributions, rng), minlength=clients
            )
            for _ in range(rounds)
        ]
    )


BUILDERS: dict[str, Callable[[NDArray[np.int64], int], NDArray[np.float64]]] = {
    "by_size": clustered_distributions_by_size,
    "by_similarity": lambda sizes, m: clustered_distributions_by_similarity(
        sizes, np.random.default_rng(5).standard_normal((sizes.size, 8)), m
    ),
}


@pytest.mark.parametrize("builder", BUILDERS)
def test_selection_frequencies_and_weight_variance(builder: str) -> None:
    """Mean draws per round match m p_i and the empirical variance of
    omega_i = draws / m matches (1/m^2) sum_k r_ki (1 - r_ki)."""
    rounds, m = 20_000, 5
    sizes = np.array([400, 120, 90, 60, 60, 45, 30, 30, 20, 10, 8, 5, 3, 1])
    distributions = BUILDERS[builder](sizes, m)
    counts = count_draws(distributions, rounds, seed=6)

    # A client's count is a sum of independent Bernoulli(r_ki), one per row.
    bernoulli_var = distributions * (1 - distributions)
    count_var = bernoulli_var.sum(axis=0)
    expected = m * sizes / sizes.sum()
    tolerance = 4 * np.sqrt(count_var / rounds) + EXACT
    assert np.all(np.abs(counts.mean(axis=0) - expected) <= tolerance)

    # Var of the sample variance ~ (mu4 - var^2) / rounds, with the fourth
    # central moment of a sum of independent Bernoullis.
    bernoulli_mu4 = bernoulli_var * (1 - 3 * bernoulli_var)
    count_mu4 = bernoulli_mu4.sum(axis=0) + 3 * (
        count_var**2 - (bernoulli_var**2).sum(axis=0)
    )
    variance_tolerance = (
        4 * np.sqrt(np.maximum(count_mu4 - count_var**2, 0) / rounds) / m**2 + EXACT
    )
    empirical = counts.var(axis=0, ddof=1) / m**2
    formula = aggregation_weight_variance(distributions)
    np.testing.assert_allclose(formula, count_var / m**2, rtol=0, atol=EXACT)
    assert np.all(np.abs(empirical - formula) <= variance_tolerance)


def test_md_variance_formula() -> None:
    """m i.i.d. draws: the variance of omega_i is p_i (1 - p_i) / m, which is
    also what clustered sampling gives when every row equals p."""
    p = np.array([0.5, 0.3, 0.2])
    np.testing.assert_allclose(
        md_aggregation_weight_variance(p, 4), p * (1 - p) / 4, atol=EXACT
    )
    np.testing.assert_allclose(
        aggregation_weight_variance(np.tile(p, (4, 1))),
        md_aggregation_weight_variance(p, 4),
        atol=EXACT,
    )


@settings(max_examples=100, deadline=None)
@given(sizes_and_m(), st.integers(0, 2**32 - 1))
def test_clustered_variance_never_above_md(
    case: tuple[NDArray[np.int64], int], seed: int
) -> None:
    """Paper, eq. 17, for every client and both algorithms."""
    sizes, m = case
    p = sizes / sizes.sum()
    md = md_aggregation_weight_variance(p, m)
    grads = np.random.default_rng(seed).standard_normal((sizes.size, 3))
    for distributions in (
        clustered_distributions_by_size(sizes, m),
        clustered_distributions_by_similarity(sizes, grads, m),
    ):
        assert np.all(aggregation_weight_variance(distributions) <= md + EXACT)


def test_sampling_never_draws_zero_probability_clients() -> None:
    rng = np.random.default_rng(7)
    distributions = np.zeros((3, 6))
    distributions[0, 5] = 1.0  # certain draw at the last column
    distributions[1, [0, 3]] = [0.25, 0.75]
    distributions[2, [1, 2]] = 0.5
    for _ in range(2000):
        drawn = sample_from_distributions(distributions, rng)
        assert drawn.dtype == np.int64
        assert drawn.shape == (3,)
        assert np.all(distributions[np.arange(3), drawn] > 0)


# --- random projection ----------------------------------------------------------


def test_projection_is_seeded_and_row_wise() -> None:
    grads = np.random.default_rng(8).standard_normal((3, 5000))
    batch = project_gradients(grads, 16, seed=1)
    assert batch.dtype == np.float32
    assert batch.shape == (3, 16)
    np.testing.assert_array_equal(batch, project_gradients(grads, 16, seed=1))
    # Same matrix; only the float32 summation order differs (GEMV vs GEMM).
    np.testing.assert_allclose(
        project_gradients(grads[1], 16, seed=1),
        batch[1],
        rtol=0,
        atol=1e-5 * np.abs(batch).max(),
    )
    assert not np.allclose(batch, project_gradients(grads, 16, seed=2))


def test_projection_distortion_matches_docstring() -> None:
    """||P x||^2 / ||x||^2 over CountSketch seeds: mean 1, variance
    2 (||x||^4 - sum x_i^4) / (dim ||x||^4). With ~128 entries per bucket each
    bucket sum is near Gaussian, so the ratio is near chi2(dim) / dim and the
    tolerance on the variance uses that law's moments (kurtosis 3 + 12/dim).
    """
    dim, seeds = 32, 300
    x = np.random.default_rng(9).standard_normal(4100)  # two projection blocks
    ratios = np.array(
        [
            np.sum(project_gradients(x, dim, seed).astype(np.float64) ** 2)
            for seed in range(seeds)
        ]
    ) / np.sum(x**2)
    variance = 2 * (np.sum(x**2) ** 2 - np.sum(x**4)) / (dim * np.sum(x**2) ** 2)
    assert abs(ratios.mean() - 1) <= 4 * np.sqrt(variance / seeds)
    variance_se = np.sqrt(variance**2 * (2 + 12 / dim) / seeds)
    assert abs(ratios.var(ddof=1) - variance) <= 4 * variance_se


# --- invalid input ----------------------------------------------------------------

GOOD_SIZES = np.array([3, 4, 5])
GOOD_GRADS = np.ones((3, 2))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: clustered_distributions_by_size([3, -1, 5], 2), "negative"),
        (lambda: clustered_distributions_by_size([3, np.nan, 5], 2), "NaN"),
        (lambda: clustered_distributions_by_size([3, 1.5, 5], 2), "integer"),
        (lambda: clustered_distributions_by_size([0, 0], 1), "all be zero"),
        (lambda: clustered_distributions_by_size([[1, 2]], 1), "1-D"),
        (lambda: clustered_distributions_by_size(GOOD_SIZES, 4), r"\[0, 3\]"),
        (lambda: clustered_distributions_by_size(GOOD_SIZES, 0), ">= 1"),
        (lambda: clustered_distributions_by_size([2**52, 1], 2), "exact"),
        (
            lambda: clustered_distributions_by_similarity(GOOD_SIZES, GOOD_GRADS, 4),
            r"\[0, 3\]",
        ),
        (
            lambda: clustered_distributions_by_similarity(
                GOOD_SIZES, np.ones((2, 2)), 2
            ),
            "shape",
        ),
        (
            lambda: clustered_distributions_by_similarity(GOOD_SIZES, np.ones(3), 2),
            "shape",
        ),
        (
            lambda: clustered_distributions_by_similarity(
                GOOD_SIZES, np.ones((3, 0)), 2
            ),
            "shape",
        ),
        (
            lambda: clustered_distributions_by_similarity(
                GOOD_SIZES, np.array([[1, 2], [np.inf, 0], [0, 1]]), 2
            ),
            "NaN or infinite",
        ),
        (
            lambda: clustered_distributions_by_similarity(
                GOOD_SIZES,
                GOOD_GRADS,
                2,
                "cosine",  # type: ignore[arg-type]
            ),
            "distance",
        ),
        (
            lambda: clustered_distributions_from_distances(
                GOOD_SIZES, np.ones((2, 2)), 2
            ),
            "shape",
        ),
        (
            lambda: clustered_distributions_from_distances(
                GOOD_SIZES, np.triu(np.ones((3, 3))), 2
            ),
            "symmetric",
        ),
        (
            lambda: clustered_distributions_from_distances(
                GOOD_SIZES, -np.ones((3, 3)), 2
            ),
            "negative",
        ),
        (lambda: pairwise_distances(np.ones(4)), "shape"),
        (lambda: pairwise_distances(GOOD_GRADS, "l3"), "distance"),  # type: ignore[arg-type]
        (
            lambda: sample_from_distributions([[0.5, 0.4]], np.random.default_rng()),
            "sum",
        ),
        (lambda: sample_from_distributions([0.5, 0.5], np.random.default_rng()), "2-D"),
        (
            lambda: sample_from_distributions([[1.5, -0.5]], np.random.default_rng()),
            r"\[0, 1\]",
        ),
        (
            lambda: sample_from_distributions(
                np.zeros((0, 3)), np.random.default_rng()
            ),
            "empty",
        ),
        (lambda: aggregation_weight_variance([[0.2, 0.2]]), "sum"),
        (lambda: md_aggregation_weight_variance([0.5, 1.5], 2), r"\[0, 1\]"),
        (lambda: md_aggregation_weight_variance([0.5, 0.5], 0), ">= 1"),
        (lambda: project_gradients(np.ones((2, 3)), 0, seed=0), ">= 1"),
        (lambda: project_gradients(np.ones((2, 3, 4)), 2, seed=0), "1-D or 2-D"),
        (lambda: project_gradients([np.nan, 1.0], 2, seed=0), "NaN"),
    ],
)
def test_invalid_input_raises(call: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_a_count_of_the_wrong_type_raises_type_error() -> None:
    with pytest.raises(TypeError, match="must be an int"):
        clustered_distributions_by_size(GOOD_SIZES, 1.5)  # type: ignore[arg-type]
