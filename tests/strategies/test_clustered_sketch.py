"""The CountSketch that compresses Algorithm 2's representative gradients.

Statistical checks use fixed seeds and tolerances of 4 standard errors from
the number of draws and the sketch's exact variance (Weinberger et al. 2009,
Lemma 2, over the pairs of coordinates that can collide): with the blocked
hash, ``Var<Sx, Sy> = sum_{i<k, different blocks} (x_i y_k + x_k y_i)^2 / dim``.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord
from numpy.typing import NDArray

from flwr_importance.sampling.distances import Distance
from flwr_importance.sampling.representatives import RepresentativeGradients
from flwr_importance.sampling.scale.sketch import CountSketch, project_gradients
from flwr_importance.strategies.clustered import ClusteredSampling


def pair_sum(x: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.float64]:
    """``sum_{i<k} (x_i y_k + x_k y_i)^2`` along the last axis."""
    return np.asarray(
        np.sum(x**2, -1) * np.sum(y**2, -1)
        + np.sum(x * y, -1) ** 2
        - 2 * np.sum(x**2 * y**2, -1)
    )


def random_hash_variance(
    x: NDArray[np.float64], y: NDArray[np.float64], dim: int
) -> float:
    """Variance of ``<S x, S y>`` under a fully random hash: every pair collides."""
    return float(pair_sum(x, y) / dim)


def sketch_variance(x: NDArray[np.float64], y: NDArray[np.float64], dim: int) -> float:
    """Exact variance of ``<S x, S y>``: the pairs of different blocks only."""
    blocks = -(-x.size // dim)

    def by_block(vector: NDArray[np.float64]) -> NDArray[np.float64]:
        return np.pad(vector, (0, blocks * dim - vector.size)).reshape(blocks, dim)

    within = float(np.sum(pair_sum(by_block(x), by_block(y))))
    return float(pair_sum(x, y) - within) / dim


def mean_square_tolerance(errors: NDArray[np.float64]) -> float:
    """4 standard errors of the mean of ``errors**2`` (from its sample variance)."""
    return float(4 * np.std(errors**2, ddof=1) / np.sqrt(errors.size))


def test_the_same_seed_gives_the_same_sketch_and_another_seed_another() -> None:
    vectors = np.random.default_rng(1).standard_normal((3, 5000))
    first = CountSketch(5000, 64, np.random.default_rng(7))
    again = CountSketch(5000, 64, np.random.default_rng(7))
    other = CountSketch(5000, 64, np.random.default_rng(8))
    for vector in vectors:
        np.testing.assert_array_equal(first.apply(vector), again.apply(vector))
        assert not np.allclose(first.apply(vector), other.apply(vector))
    # The one-shot form draws the same sketch from the same seed.
    np.testing.assert_array_equal(
        project_gradients(vectors, 64, seed=7),
        np.stack([first.apply(vector) for vector in vectors]),
    )


def test_every_node_and_round_shares_one_sketch() -> None:
    # The same update stored for different nodes in different rounds gives the
    # same row, the seed's sketch: rows of different rounds are comparable.
    update = np.random.default_rng(2).standard_normal(3000)
    state = RepresentativeGradients("arccos", 32, seed=5)
    state.align([10, 11, 12])
    state.update({10: update})
    state.distances()
    state.update({11: np.ones(3000)})
    state.align([12, 11, 10, 13])
    state.update({13: update})
    expected = project_gradients(update, 32, seed=5)
    np.testing.assert_array_equal(state.gradient(10), expected)
    np.testing.assert_array_equal(state.gradient(13), expected)
    np.testing.assert_array_equal(state.gradient(12), 0.0)


def test_inner_products_are_unbiased_with_the_known_variance() -> None:
    dim, seeds, size = 16, 4000, 300
    rng = np.random.default_rng(3)
    x = rng.standard_normal(size)
    y = 0.6 * x + rng.standard_normal(size)
    # A few large coordinates in one block: the cross term is not uniform,
    # and the pairs the blocks keep apart weigh enough that the variance of a
    # fully random hash is more than 8 standard errors away.
    x[:3] *= 10
    y[:3] *= 10
    estimates = np.array(
        [
            CountSketch(size, dim, np.random.default_rng(seed)).apply(x).astype(float)
            @ CountSketch(size, dim, np.random.default_rng(seed)).apply(y)
            for seed in range(seeds)
        ]
    )
    variance = sketch_variance(x, y, dim)
    errors = estimates - x @ y
    assert abs(errors.mean()) <= 4 * np.sqrt(variance / seeds)
    assert abs(np.mean(errors**2) - variance) <= mean_square_tolerance(errors)
    gap = random_hash_variance(x, y, dim) - variance
    assert gap >= 2 * mean_square_tolerance(errors)


def vectors_of_a_model(size: int) -> dict[str, NDArray[np.float64]]:
    """Updates of different shapes: dense, rank one (a layer), sparse, heavy-tailed.

    ``rank-one-1024``: a layer whose rows are as long as the sketch's blocks
    (1,024), so that every block is a copy of one row, scaled: the shape
    most likely to make rotated blocks collide together.
    """
    rng = np.random.default_rng(4)
    sparse = np.zeros(size)
    sparse[rng.choice(size, 1000, replace=False)] = rng.standard_normal(1000)
    rows = size // 250
    return {
        "dense": rng.standard_normal(size),
        "rank-one": np.outer(
            rng.standard_normal(rows), rng.standard_normal(250)
        ).ravel(),
        "sparse": sparse,
        "heavy-tailed": rng.standard_normal(size)
        * np.exp(2 * rng.standard_normal(size)),
        "rank-one-1024": np.pad(
            np.outer(
                rng.standard_normal(size // 1024), rng.standard_normal(1024)
            ).ravel(),
            (0, size % 1024),
        ),
    }


@pytest.mark.parametrize(
    "kind", ["dense", "rank-one", "sparse", "heavy-tailed", "rank-one-1024"]
)
def test_norms_are_preserved_at_projection_dim_1024(kind: str) -> None:
    # ||S x||^2 / ||x||^2 over 100 sketches (a squared distance is the squared
    # norm of a difference): mean 1, variance sigma^2 at most the random
    # hash's 2 (|x|^4 - sum x_i^4) / (dim |x|^4) <= 2 / dim (sigma <= 4.4%).
    dim, seeds, size = 1024, 100, 100_000
    x = vectors_of_a_model(size)[kind]
    squared_norm = x @ x
    sigma = np.sqrt(sketch_variance(x, x, dim)) / squared_norm
    assert sketch_variance(x, x, dim) <= random_hash_variance(x, x, dim)
    assert sigma <= np.sqrt(2 / dim)
    ratios = np.array(
        [
            np.sum(
                CountSketch(size, dim, np.random.default_rng(seed))
                .apply(x)
                .astype(float)
                ** 2
            )
            / squared_norm
            for seed in range(seeds)
        ]
    )
    errors = ratios - 1
    assert abs(errors.mean()) <= 4 * sigma / np.sqrt(seeds)
    assert abs(np.mean(errors**2) - sigma**2) <= mean_square_tolerance(errors)
    # Chebyshev, whatever the vector: at most 1/9 of the sketches miss by
    # more than 3 sigma (13%); heavy tails (a few coordinates holding most of
    # the norm) make single large misses possible, not frequent.
    beyond = 1 / 9
    assert np.mean(np.abs(errors) > 3 * sigma) <= beyond + 4 * np.sqrt(
        beyond * (1 - beyond) / seeds
    )


GROUPS, NODES_PER_GROUP, PARAMETERS = 5, 8, 60_000


def group_clustering(
    distance: Distance, projection_dim: int | None
) -> set[frozenset[int]]:
    """The supports of Algorithm 2's distributions on five separated groups.

    Node ``i`` belongs to group ``i % 5``; its update is its group's direction
    plus noise a third as large.  Equal sizes make each group exactly one
    distribution's worth of units, so a clustering that finds the groups
    gives one distribution per group.
    """
    rng = np.random.default_rng(6)
    directions = rng.standard_normal((GROUPS, PARAMETERS)).astype(np.float32)
    global_model = rng.standard_normal(PARAMETERS).astype(np.float32)
    node_ids = list(range(GROUPS * NODES_PER_GROUP))
    models = {
        node: global_model
        + directions[node % GROUPS]
        + rng.standard_normal(PARAMETERS).astype(np.float32) / 3
        for node in node_ids
    }
    strategy = ClusteredSampling(
        clients_per_round=GROUPS,
        distance=distance,
        projection_dim=projection_dim,
        seed=0,
    )
    strategy.track_nodes(node_ids)
    strategy.record_updates(
        {node: ArrayRecord([model]) for node, model in models.items()},
        ArrayRecord([global_model]),
    )
    distributions = strategy.distributions(node_ids, np.full(len(node_ids), 10))
    return {frozenset(np.flatnonzero(row).tolist()) for row in distributions}


@pytest.mark.parametrize("distance", ["arccos", "l2"])
def test_similarity_clustering_finds_the_groups_with_and_without_projection(
    distance: Distance,
) -> None:
    groups = {
        frozenset(range(group, GROUPS * NODES_PER_GROUP, GROUPS))
        for group in range(GROUPS)
    }
    assert group_clustering(distance, None) == groups
    assert group_clustering(distance, 256) == groups


def test_bad_dimensions_and_vectors_are_rejected() -> None:
    sketch = CountSketch(4, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="input_dim"):
        CountSketch(0, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="dim"):
        CountSketch(4, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="shape"):
        sketch.apply(np.ones(5))
    with pytest.raises(ValueError, match="NaN"):
        sketch.apply([1.0, np.nan, 0.0, 0.0])
    with pytest.raises(ValueError, match="NaN"):
        sketch.apply([np.inf, 0.0, 0.0, 0.0])


def test_a_difference_sketched_array_by_array_is_the_same_sketch() -> None:
    """``apply_difference`` gives ``apply`` of the concatenated difference exactly."""
    rng = np.random.default_rng(3)
    shapes = [(30, 20), (20,), (5, 4, 3)]
    model = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    start = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    total = sum(int(np.prod(shape)) for shape in shapes)
    sketch = CountSketch(total, 16, np.random.default_rng(0))
    whole = np.concatenate([part.ravel() for part in model]) - np.concatenate(
        [part.ravel() for part in start]
    )
    np.testing.assert_array_equal(
        sketch.apply_difference(model, start), sketch.apply(whole)
    )
    with pytest.raises(ValueError, match="pair up"):
        sketch.apply_difference(model[:2], start)
