"""Aggregation rules as pure NumPy functions over flattened model vectors.

Shared combinations live here; a method's own weighting rule lives in a module
named after the method (``flwr_importance.aggregation.folb`` ...).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import ArrayLike, NDArray


def weighted_sum(
    vectors: Iterable[NDArray[np.floating]], weights: ArrayLike
) -> NDArray[np.floating]:
    """``sum_k weights[k] * vectors[k]``, accumulated in place, one at a time.

    ``vectors`` may be a generator: each vector is added and then dropped, so
    memory stays at about three model copies whatever the number of clients
    (a list of 1,000 float64 copies of a 1M-parameter model is 8 GB, and
    touching that much fresh memory also costs more time than the sum).

    The sum is kept in the vectors' precision (float32 models are summed in
    float32, as Flower's ``FedAvg`` does; float64 vectors in float64).

    Parameters
    ----------
    vectors : Iterable[NDArray]
        Equal-length 1-D vectors (flattened models or updates).
    weights : ArrayLike
        One finite weight per vector.

    Returns
    -------
    NDArray[np.floating]
        The weighted sum, float32 or wider.

    Examples
    --------
    >>> vectors = [np.array([1.0, 2.0]), np.array([3.0, 4.0])]
    >>> weighted_sum(vectors, [0.5, 0.5]).tolist()
    [2.0, 3.0]
    >>> weighted_sum([np.ones(2, np.float32)], [2.0]).dtype
    dtype('float32')
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 1:
        raise ValueError(f"weights must be 1-D, got shape {weights.shape}")
    if not np.all(np.isfinite(weights)):
        raise ValueError("weights contain NaN or infinite values")
    total, count = _accumulate(vectors, weights)
    if count != weights.size:
        raise ValueError(f"{count} vectors but weights of shape {weights.shape}")
    return total


def mean(vectors: Iterable[NDArray[np.floating]]) -> NDArray[np.floating]:
    """Plain mean of the vectors (eq. 5 of ISFedAvg; clustered and MD sampling).

    Accumulated one vector at a time, in the vectors' precision, as
    :func:`weighted_sum`.

    Examples
    --------
    >>> mean(iter([np.array([1.0, 2.0]), np.array([3.0, 4.0])])).tolist()
    [2.0, 3.0]
    """
    total, count = _accumulate(vectors, None)
    total /= count
    return total


def _accumulate(
    vectors: Iterable[NDArray[np.floating]], weights: NDArray[np.float64] | None
) -> tuple[NDArray[np.floating], int]:
    """``(sum_k w_k v_k, number of vectors)``; ``weights=None``: all ones."""
    total: NDArray[np.floating] | None = None
    scaled: NDArray[np.floating] | None = None
    count = 0
    for vector in vectors:
        if weights is not None and count >= weights.size:
            raise ValueError(f"more vectors than the {weights.size} weights")
        if total is None or scaled is None:
            total = np.zeros(np.shape(vector), np.result_type(vector, np.float32))
            # One scratch buffer for the products: a fresh temporary per vector
            # costs an allocation (and its page faults) per client.
            scaled = np.empty_like(total)
        elif vector.shape != total.shape:
            raise ValueError(f"vector of shape {vector.shape}, expected {total.shape}")
        if weights is None:
            total += vector
        else:
            # A Python float keeps a float32 product in float32 (NEP 50).
            np.multiply(vector, float(weights[count]), out=scaled)
            total += scaled
        count += 1
    if total is None:
        raise ValueError("need at least one vector to aggregate")
    return total, count
