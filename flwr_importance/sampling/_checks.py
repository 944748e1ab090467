"""Input validation shared by the samplers.

Every public function rejects bad input with a ``ValueError`` that says what is
wrong, before any maths runs.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def finite_array(name: str, values: ArrayLike, ndim: int) -> NDArray[np.float64]:
    """Return ``values`` as an ``ndim``-D float array, checking it is finite."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def nonnegative_array(name: str, values: ArrayLike, ndim: int) -> NDArray[np.float64]:
    """Return ``values`` as an ``ndim``-D float array, finite and >= 0."""
    array = finite_array(name, values, ndim)
    if np.any(array < 0):
        raise ValueError(f"{name} contains negative values (min {array.min():g})")
    return array


def nonnegative_vector(name: str, values: ArrayLike) -> NDArray[np.float64]:
    """Return ``values`` as a 1-D float array, checking it is finite and >= 0."""
    return nonnegative_array(name, values, 1)


def nonnegative_matrix(name: str, values: ArrayLike) -> NDArray[np.float64]:
    """Return ``values`` as a 2-D float array, checking it is finite and >= 0."""
    return nonnegative_array(name, values, 2)


def probability_array(
    name: str, values: ArrayLike, ndim: int = 1
) -> NDArray[np.float64]:
    """Return ``values`` as a float array of probabilities in [0, 1]."""
    array = finite_array(name, values, ndim)
    if np.any(array < 0) or np.any(array > 1):
        raise ValueError(
            f"{name} must lie in [0, 1], got range [{array.min():g}, {array.max():g}]"
        )
    return array


def sample_count(name: str, count: int, population: int) -> int:
    """Check that ``count`` is an integer in ``[0, population]``."""
    if isinstance(count, bool) or int(count) != count:
        raise ValueError(f"{name} must be an integer, got {count!r}")
    if count < 0 or count > population:
        raise ValueError(f"{name} must lie in [0, {population}], got {count}")
    return int(count)


def nonnegative_integer(name: str, value: int) -> int:
    """Check that ``value`` is an integer >= 0 (no upper bound)."""
    if isinstance(value, bool) or int(value) != value:
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def probability_distribution(
    name: str, values: ArrayLike, tolerance: float = 1e-9
) -> NDArray[np.float64]:
    """Return ``values`` as a 1-D float array of nonnegative entries summing to 1."""
    array = nonnegative_vector(name, values)
    total = float(array.sum())
    if abs(total - 1.0) > tolerance:
        raise ValueError(f"{name} must sum to 1 (within {tolerance:g}), got {total!r}")
    return array


def distinct_indices(name: str, values: ArrayLike, population: int) -> NDArray[np.intp]:
    """Return ``values`` as a 1-D array of distinct integers in ``[0, population)``."""
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if array.size == 0:
        return np.empty(0, dtype=np.intp)
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.min() < 0 or array.max() >= population:
        raise ValueError(
            f"{name} must lie in [0, {population}), "
            f"got range [{array.min()}, {array.max()}]"
        )
    if np.unique(array).size != array.size:
        raise ValueError(f"{name} contains repeated indices")
    return array.astype(np.intp)
