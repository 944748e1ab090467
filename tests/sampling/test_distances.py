"""``cross_distances`` and ``pairwise_distances``: the rows a strategy recomputes
match the full matrix, and bad gradients are rejected; the symmetry check of
``clustered_distributions_from_distances`` reads the whole matrix."""

from __future__ import annotations

import numpy as np
import pytest

import flwr_importance.sampling.distances as distances_module
from flwr_importance.sampling.clustered import clustered_distributions_from_distances
from flwr_importance.sampling.distances import (
    DISTANCES,
    Distance,
    cross_distances,
    pairwise_distances,
)


def gradients(dtype: type[np.floating]) -> np.ndarray:
    """Twelve gradients, two of them zero and two of the same direction."""
    rows = np.random.default_rng(3).standard_normal((12, 50)).astype(dtype)
    rows[[1, 8]] = 0.0
    rows[6] = 2 * rows[5]
    return rows


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("distance", DISTANCES)
def test_cross_distances_are_rows_of_the_pairwise_matrix(
    distance: Distance, dtype: type[np.floating]
) -> None:
    grads = gradients(dtype)
    rows = [0, 1, 5, 8]
    full = pairwise_distances(grads, distance)
    # float32 inner products carry ~1e-7 relative error, then arccos near 1
    # amplifies it; 1e-3 rad is still far below the distances being clustered.
    tolerance = 1e-6 if dtype is np.float64 else 1e-3
    if distance == "l2" and dtype is np.float32:
        # ||a||^2 + ||b||^2 - 2<a, b> cancels to an error of up to d eps ||a|| ||b||
        # (the summation bound), and the square root turns that into
        # sqrt(d eps) max ||g|| for a distance near 0 (BLAS-dependent: a
        # self-distance of 0.004 was seen on one machine, 0 on another).
        max_norm = float(np.linalg.norm(grads, axis=1).max())
        tolerance = float(np.sqrt(grads.shape[1] * np.finfo(np.float32).eps)) * max_norm
    np.testing.assert_allclose(
        cross_distances(grads[rows], grads, distance),
        full[rows],
        rtol=tolerance,
        atol=tolerance,
    )


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("distance", DISTANCES)
def test_selected_rows_are_those_of_the_full_result_to_the_last_bit(
    distance: Distance, dtype: type[np.floating]
) -> None:
    grads = gradients(dtype)
    full = cross_distances(grads, grads, distance)
    for rows in ([3], [0, 1], [11, 2, 5, 6, 8], []):
        np.testing.assert_array_equal(
            cross_distances(grads, grads, distance, rows=rows), full[rows]
        )


def test_selected_rows_must_be_distinct_rows_of_the_left_gradients() -> None:
    grads = gradients(np.float64)
    with pytest.raises(ValueError, match="repeated"):
        cross_distances(grads[:3], grads, rows=[1, 1])
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        cross_distances(grads[:3], grads, rows=[3])


def test_zero_gradients_follow_the_convention() -> None:
    grads = gradients(np.float64)
    block = cross_distances(grads[[1]], grads, "arccos")[0]
    assert block[8] == 0.0  # two zero gradients: same direction
    assert np.all(block[np.setdiff1d(np.arange(12), [1, 8])] == np.pi / 2)


def test_l1_blocks_give_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    grads = gradients(np.float64)
    expected = cross_distances(grads[:3], grads, "l1")
    # One row of 50 float64 entries per block: twelve blocks.
    monkeypatch.setattr(distances_module, "_L1_BLOCK_BYTES", 8 * 50)
    np.testing.assert_array_equal(cross_distances(grads[:3], grads, "l1"), expected)


def test_cross_distances_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="same dimension"):
        cross_distances(np.ones((2, 3)), np.ones((4, 5)))
    with pytest.raises(ValueError, match="distance must be one of"):
        cross_distances(np.ones((2, 3)), np.ones((4, 3)), "cosine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NaN"):
        cross_distances(np.full((2, 3), np.nan), np.ones((4, 3)))


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("bad_value", [np.nan, np.inf, -np.inf])
def test_non_finite_gradients_are_rejected(
    distance: Distance, bad_value: float
) -> None:
    grads = gradients(np.float64)
    grads[4, 7] = bad_value
    with pytest.raises(ValueError, match="NaN or infinite"):
        pairwise_distances(grads, distance)
    with pytest.raises(ValueError, match="NaN or infinite"):
        cross_distances(grads[:2], grads, distance)
    with pytest.raises(ValueError, match="NaN or infinite"):
        cross_distances(grads[4:5], grads[:3], distance)


@pytest.mark.parametrize("distance", ["arccos", "l2"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gradients_too_large_to_square_are_rejected(
    distance: Distance, dtype: type[np.floating]
) -> None:
    # Finite, but the squared norm overflows: the distances would be NaN.
    grads = gradients(dtype)
    grads[4, 7] = np.finfo(dtype).max / 2
    with pytest.raises(ValueError, match="too large to square"):
        pairwise_distances(grads, distance)
    with pytest.raises(ValueError, match="too large to square"):
        cross_distances(grads[:2], grads, distance)


def symmetric_distances(clients: int) -> np.ndarray:
    """A symmetric matrix spanning several tiles of the symmetry check."""
    upper = np.triu(np.random.default_rng(5).random((clients, clients)), 1)
    return upper + upper.T


@pytest.mark.parametrize(
    ("entry", "relative_gap"),
    [
        ((10, 550), 1e-8),  # upper triangle, far from the diagonal
        ((550, 10), 1e-8),  # its mirror
        ((3, 7), 1e-8),  # inside a tile on the diagonal
        ((599, 598), 1e-8),  # in the last, partial tile
        ((300, 20), 1.0),  # one entry doubled
    ],
)
def test_asymmetric_distances_are_rejected_wherever_the_gap_is(
    entry: tuple[int, int], relative_gap: float
) -> None:
    distances = symmetric_distances(600)
    distances[entry] *= 1 + relative_gap
    with pytest.raises(ValueError, match="symmetric"):
        clustered_distributions_from_distances(np.ones(600, int), distances, 5)


def test_a_zero_distance_must_be_mirrored_by_a_zero() -> None:
    distances = symmetric_distances(300)
    distances[40, 270], distances[270, 40] = 0.0, 1e-300
    with pytest.raises(ValueError, match="symmetric"):
        clustered_distributions_from_distances(np.ones(300, int), distances, 5)


def test_rounding_gaps_within_the_tolerance_are_accepted() -> None:
    # Relative gaps below 1e-9, as two float computations of one distance.
    distances = symmetric_distances(600)
    distances[10, 550] *= 1 + 1e-10
    distances[550, 20] *= 1 - 1e-10
    distributions = clustered_distributions_from_distances(
        np.ones(600, int), distances, 5
    )
    np.testing.assert_allclose(distributions.sum(axis=1), 1.0)
