"""Aggregation rules as pure NumPy functions over flattened model vectors.

Shared combinations live here; a method's own weighting rule lives in a module
named after the method (``flwr_importance.aggregation.folb`` ...).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray


def weighted_sum(
    vectors: Sequence[NDArray[np.floating]], weights: ArrayLike
) -> NDArray[np.float64]:
    """``sum_k weights[k] * vectors[k]``, accumulated in place (no stacking).

    Accumulating keeps memory at two model copies whatever the number of
    clients, which matters at 1,000 clients of a 1M-parameter model.

    Parameters
    ----------
    vectors : Sequence[NDArray]
        Equal-length 1-D vectors (flattened models or updates).
    weights : ArrayLike
        One finite weight per vector.

    Returns
    -------
    NDArray[np.float64]
        The weighted sum.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape != (len(vectors),):
        raise ValueError(f"{len(vectors)} vectors but weights of shape {weights.shape}")
    if not vectors:
        raise ValueError("weighted_sum needs at least one vector")
    if not np.all(np.isfinite(weights)):
        raise ValueError("weights contain NaN or infinite values")
    total = np.zeros(vectors[0].shape, dtype=np.float64)
    # One scratch buffer for the products: a fresh temporary per vector costs
    # an allocation (and its page faults) per client.
    scaled = np.empty_like(total)
    for weight, vector in zip(weights, vectors, strict=True):
        if vector.shape != total.shape:
            raise ValueError(f"vector of shape {vector.shape}, expected {total.shape}")
        np.multiply(vector, weight, out=scaled)
        total += scaled
    return total


def mean(vectors: Sequence[NDArray[np.floating]]) -> NDArray[np.float64]:
    """Plain mean of the vectors (eq. 5 of ISFedAvg; clustered and MD sampling)."""
    return weighted_sum(vectors, np.full(len(vectors), 1.0 / max(len(vectors), 1)))
