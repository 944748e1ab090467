"""Distances between clients' representative gradients (clustered sampling).

Algorithm 2 of clustered sampling (Fraboni et al., ICML 2021) groups clients
by the dissimilarity of their representative gradients:

- :func:`pairwise_distances`: the symmetric ``(N, N)`` matrix, loop-free;
- :func:`cross_distances`: the rows of the clients that returned a new
  gradient, what a strategy needs to keep that matrix up to date;
- :func:`condensed_distances`: the upper triangle, as hierarchical clustering
  takes it.

``arccos`` and ``l2`` come from one Gram matrix of inner products, computed in
the gradients' own precision (float32 stays float32) and finished in float64.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.validation import (
    check_choice,
    distinct_indices,
    finite_values,
    float_matrix,
)

__all__ = [
    "DISTANCES",
    "Distance",
    "condensed_distances",
    "cross_distances",
    "pairwise_distances",
]

# scipy is imported inside the functions that take L1 distances or condense a
# matrix, not here: it costs 0.25 s, half again the import of Flower's own
# strategies, and every strategy module imports the sampling package (most
# never cluster).

Distance = Literal["arccos", "l2", "l1"]
DISTANCES: tuple[Distance, ...] = get_args(Distance)

# Bytes of float64 copy `cross_distances` makes at a time for L1 distances.
_L1_BLOCK_BYTES = 64 * 2**20

_GRADIENTS = "representative_grads"


def pairwise_distances(
    representative_grads: ArrayLike, distance: Distance = "arccos"
) -> NDArray[np.float64]:
    """Distances between all pairs of representative gradients, loop-free.

    Parameters
    ----------
    representative_grads : ArrayLike
        Array of shape ``(N, d)``, one gradient per row (see
        :func:`~flwr_importance.sampling.clustered_distributions_by_similarity`).
    distance : {"arccos", "l2", "l1"}
        Dissimilarity between two gradients: angle between them, Euclidean or
        Manhattan distance.  Zero gradients are at angle 0 from each other and
        at angle pi/2 (orthogonal) from every non-zero gradient, so no NaN
        arises.

    Returns
    -------
    NDArray[np.float64]
        Symmetric ``(N, N)`` matrix of distances.

    Raises
    ------
    ValueError
        If the gradients are not a finite 2-D array (for ``arccos`` and
        ``l2``, also finite ones whose squared norms overflow) or ``distance``
        is unknown.

    Examples
    --------
    A zero gradient is orthogonal (angle pi/2) to every other gradient:

    >>> np.round(pairwise_distances([[1, 0], [0, 1], [0, 0]]), 4).tolist()
    [[0.0, 1.5708, 1.5708], [1.5708, 0.0, 1.5708], [1.5708, 1.5708, 0.0]]
    >>> pairwise_distances([[1, 0], [0, 2]], "l1").tolist()
    [[0.0, 3.0], [3.0, 0.0]]
    """
    grads = float_matrix(_GRADIENTS, representative_grads)
    return _distance_matrix(grads, check_choice("distance", distance, Distance))


def cross_distances(
    left_grads: ArrayLike,
    right_grads: ArrayLike,
    distance: Distance = "arccos",
    *,
    rows: ArrayLike | None = None,
) -> NDArray[np.float64]:
    """Distances between every row of ``left_grads`` and every row of ``right_grads``.

    What a strategy needs to keep a distance matrix up to date: only the rows
    (and columns) of the clients that returned a new gradient are recomputed,
    ``O(k N d)`` for ``k`` new gradients instead of ``O(N^2 d)``.  Same
    conventions as :func:`pairwise_distances` (zero gradients included);
    float32 input stays float32 for the inner products.

    Parameters
    ----------
    left_grads : ArrayLike
        Array of shape ``(k, d)``.
    right_grads : ArrayLike
        Array of shape ``(N, d)``, the same ``d``.
    distance : {"arccos", "l2", "l1"}
        Dissimilarity, as in :func:`pairwise_distances`.
    rows : ArrayLike or None
        Distinct indices of the rows of ``left_grads`` whose distances are
        returned, in that order (default: all).  They are the same rows, to
        the last bit, as in the full result: for ``arccos`` and ``l2`` the
        inner products are still taken for all of ``left_grads`` in one
        product, since BLAS picks its kernels, and so its rounding, by the
        shape of the product.  What a strategy needs when some of the rows
        it refreshes are zero gradients, whose distances it already knows.

    Returns
    -------
    NDArray[np.float64]
        Matrix of shape ``(k, N)``, or ``(len(rows), N)``.

    Raises
    ------
    ValueError
        If the gradients are not finite 2-D arrays with the same number of
        columns (for ``arccos`` and ``l2``, also finite ones whose squared
        norms overflow), ``distance`` is unknown, or ``rows`` are not
        distinct indices of rows of ``left_grads``.

    Examples
    --------
    >>> np.round(cross_distances([[1, 0]], [[1, 0], [0, 2]], "l2"), 4).tolist()
    [[0.0, 2.2361]]
    """
    left = float_matrix(_GRADIENTS, left_grads)
    right = float_matrix(_GRADIENTS, right_grads)
    if left.shape[1] != right.shape[1]:
        raise ValueError(
            f"gradients must have the same dimension, got {left.shape[1]} "
            f"and {right.shape[1]}"
        )
    name: Distance = check_choice("distance", distance, Distance)
    selected = (
        slice(None) if rows is None else distinct_indices("rows", rows, left.shape[0])
    )
    if name == "l1":
        from scipy.spatial.distance import cdist  # scipy on first use, see top

        left = finite_values(_GRADIENTS, left)[selected]
        right = finite_values(_GRADIENTS, right)
        # cdist works in float64: blocks of rows bound that copy of ``right``.
        rows_per_block = max(1, _L1_BLOCK_BYTES // (8 * right.shape[1]))
        blocks = [
            cdist(left, right[start : start + rows_per_block], metric="cityblock")
            for start in range(0, right.shape[0], rows_per_block)
        ]
        return np.hstack([np.zeros((left.shape[0], 0)), *blocks])
    left_squared_norms = _squared_row_norms(left)[selected]
    right_squared_norms = _squared_row_norms(right)
    gram = (left @ right.T)[selected].astype(np.float64)
    return _distances_from_gram(gram, left_squared_norms, right_squared_norms, name)


def condensed_distances(
    distances: NDArray[np.float64], clients: NDArray[np.intp]
) -> NDArray[np.float64]:
    """Upper triangle of the distances between ``clients``, as ``linkage`` takes it.

    When every client takes part (the usual case), the triangle is read from
    ``distances`` itself: gathering an ``N x N`` copy first would take longer
    than reading the triangle (0.6 s against 0.2 s at 10,000 clients).

    Parameters
    ----------
    distances : NDArray[np.float64]
        Symmetric ``(N, N)`` matrix of distances, already checked.
    clients : NDArray[np.intp]
        Sorted indices of the clients to keep.

    Returns
    -------
    NDArray[np.float64]
        The ``n (n - 1) / 2`` distances between the ``n`` clients, row by row
        of the upper triangle (``scipy.spatial.distance.squareform``'s form).

    Examples
    --------
    >>> distances = pairwise_distances([[0, 0], [3, 4], [6, 8]], "l2")
    >>> condensed_distances(distances, np.arange(3)).tolist()
    [5.0, 10.0, 5.0]
    >>> condensed_distances(distances, np.array([0, 2])).tolist()
    [10.0]
    """
    from scipy.spatial.distance import squareform  # scipy on first use, see top

    if clients.size < distances.shape[0]:
        distances = distances[np.ix_(clients, clients)]
    return squareform(distances, checks=False)


def _squared_row_norms(grads: NDArray) -> NDArray[np.float64]:
    """``||g_i||^2`` of every row, accumulated in the rows' own precision.

    Raises ``ValueError`` for gradients that are not finite (see
    :func:`_checked_squared_norms`).
    """
    return _checked_squared_norms(np.einsum("ij,ij->i", grads, grads))


def _checked_squared_norms(squared_norms: NDArray) -> NDArray[np.float64]:
    """Reject gradients whose squared norms are not finite; return them in float64.

    **Decision:** finiteness of the gradients is checked here, not on the
    gradients themselves: a NaN or infinite entry makes the squared norm of
    its row NaN or infinite, so this checks them without the ``isfinite``
    pass over the whole ``(N, d)`` array, which reads it once more and
    allocates ``N d`` booleans (a tenth of the Gram matrix's time at 500 x
    50,000).  It also rejects finite entries too large to square in the
    gradients' dtype, whose inner products and distances would be NaN.
    """
    if not np.all(np.isfinite(squared_norms)):
        raise ValueError(
            f"{_GRADIENTS} contains NaN or infinite values, or values "
            "too large to square"
        )
    return squared_norms.astype(np.float64)


def _distance_matrix(grads: NDArray, distance: Distance) -> NDArray[np.float64]:
    """Square matrix of pairwise distances between the rows of ``grads``.

    **Decision:** loop-free: one Gram matrix ``G G^T`` (BLAS) for ``arccos``
    and ``l2``, ``scipy.spatial.distance.pdist`` for ``l1``; the authors'
    reference loops over client pairs in Python, ``O(N^2 d)`` interpreted work.
    """
    if distance == "l1":
        from scipy.spatial.distance import pdist, squareform  # on first use, see top

        finite = finite_values(_GRADIENTS, grads)
        return squareform(pdist(finite, metric="cityblock"))
    # Non-finite gradients make the diagonal non-finite: the check below
    # reports them, so the Gram matrix's own overflow warnings are noise.
    with np.errstate(over="ignore", invalid="ignore"):
        gram = grads @ grads.T
    squared_norms = _checked_squared_norms(np.diag(gram))
    gram = gram.astype(np.float64, copy=False)
    return _distances_from_gram(gram, squared_norms, squared_norms, distance)


def _distances_from_gram(
    gram: NDArray[np.float64],
    left_squared_norms: NDArray[np.float64],
    right_squared_norms: NDArray[np.float64],
    distance: Literal["arccos", "l2"],
) -> NDArray[np.float64]:
    """``arccos`` or ``l2`` distances from inner products and squared norms.

    **Decision:** computed in place in ``gram`` (the caller's own float64
    array, returned): each ``k x N`` temporary avoided is 800 MB allocated
    and written at 10,000 x 10,000; one is left, for the norms' products or
    sums.
    """
    if distance == "l2":
        # |a - b|^2 = |a|^2 + |b|^2 - 2 <a, b>; rounding can dip below zero.
        norm_sums = np.add.outer(left_squared_norms, right_squared_norms)
        squared = np.subtract(norm_sums, np.multiply(gram, 2.0, out=gram), out=gram)
        return np.sqrt(np.maximum(squared, 0.0, out=squared), out=squared)
    left_norms = np.sqrt(left_squared_norms)
    right_norms = np.sqrt(right_squared_norms)
    left_zero, right_zero = left_norms == 0, right_norms == 0
    # Zero rows of the Gram matrix give cosine 0 (orthogonal) against any
    # vector; two zero vectors are then set to cosine 1 (same direction).
    norm_products = np.outer(
        np.where(left_zero, 1.0, left_norms), np.where(right_zero, 1.0, right_norms)
    )
    cosine = np.divide(gram, norm_products, out=gram)
    cosine[np.ix_(left_zero, right_zero)] = 1.0
    return np.arccos(np.clip(cosine, -1.0, 1.0, out=cosine), out=cosine)
