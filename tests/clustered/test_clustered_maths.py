"""``cross_distances`` and ``pairwise_distances``: the rows a strategy recomputes
match the full matrix, and bad gradients are rejected."""

from __future__ import annotations

import numpy as np
import pytest

import flwr_importance.sampling.clustered as clustered_module
from flwr_importance.sampling import DISTANCES, Distance, pairwise_distances
from flwr_importance.sampling.clustered import cross_distances


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
    np.testing.assert_allclose(
        cross_distances(grads[rows], grads, distance),
        full[rows],
        rtol=tolerance,
        atol=tolerance,
    )


def test_zero_gradients_follow_the_convention() -> None:
    grads = gradients(np.float64)
    block = cross_distances(grads[[1]], grads, "arccos")[0]
    assert block[8] == 0.0  # two zero gradients: same direction
    assert np.all(block[np.setdiff1d(np.arange(12), [1, 8])] == np.pi / 2)


def test_l1_blocks_give_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    grads = gradients(np.float64)
    expected = cross_distances(grads[:3], grads, "l1")
    # One row of 50 float64 entries per block: twelve blocks.
    monkeypatch.setattr(clustered_module, "_L1_BLOCK_BYTES", 8 * 50)
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
