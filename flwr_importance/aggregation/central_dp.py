"""Central DP for importance-weighted aggregates: clipped weighted sums and noise.

A strategy of the library releases ``base + sum_k c_k`` where client ``k``'s
contribution ``c_k`` already carries its importance weight (``lr d_k / p_k``
for OCS, ``-eta`` for FedSampling's ``G_c``, ``1 / m`` per draw for the
sampled means). Clipping each *weighted* contribution to ``clipping_norm``
bounds what one client can move the release by (its L2 sensitivity under
adding or removing the client) by ``clipping_norm`` whatever its weight, so
Gaussian noise of standard deviation ``noise_multiplier * clipping_norm``
covers every round, however small a sampling probability was
(``docs/privacy.md``).

Flower's own clipping (:func:`flwr.supercore.differential_privacy.clip_inputs_inplace`)
and standard deviation (``compute_stdv``) are used as they are; only the
noise is drawn here, from a generator the caller passes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from flwr.supercore.differential_privacy import (
    clip_inputs_inplace,
    compute_stdv,
    get_norm,
)
from numpy.typing import NDArray

#: One client's contribution: its arrays, in the model's order.
Contribution = list[NDArray[np.float64]]


def clipped_sum(
    contributions: Iterable[Contribution], clipping_norm: float
) -> tuple[Contribution, int]:
    """``sum_k clip(c_k)``, each ``c_k`` scaled down to L2 norm ``clipping_norm``.

    The norm is over all of a contribution's arrays together (Flower's
    ``clip_inputs_inplace``, which scales the arrays in place). A zero
    contribution stays zero.

    Parameters
    ----------
    contributions : Iterable[list[NDArray]]
        Each client's weighted contribution, arrays of equal shapes across
        clients; consumed one at a time (and clipped in place).
    clipping_norm : float
        ``C > 0``.

    Returns
    -------
    tuple[list[NDArray], int]
        The sum, array by array, and how many contributions were clipped.

    Raises
    ------
    ValueError
        No contribution.

    Examples
    --------
    >>> total, clipped = clipped_sum(
    ...     [[np.array([3.0, 4.0])], [np.array([0.3, 0.4])]], clipping_norm=1.0
    ... )
    >>> np.round(total[0], 6).tolist(), clipped
    ([0.9, 1.2], 1)
    """
    total: Contribution | None = None
    clipped = 0
    for contribution in contributions:
        norm = get_norm(contribution)
        if norm > clipping_norm:
            clip_inputs_inplace(contribution, clipping_norm)
            clipped += 1
        if total is None:
            total = [np.array(array, dtype=np.float64) for array in contribution]
        else:
            for accumulated, array in zip(total, contribution, strict=True):
                accumulated += array
    if total is None:
        raise ValueError("need at least one contribution")
    return total, clipped


def clipped_rows_sum(
    rows: NDArray[np.float64], row_bound: float
) -> NDArray[np.float64]:
    """The sum of ``rows`` (one per client), each scaled down to L2 norm ``row_bound``.

    One client moves the sum by at most ``row_bound`` (its L2 sensitivity
    under adding or removing the client). ``row_bound`` may be ``inf``.

    Examples
    --------
    >>> clipped_rows_sum(np.array([[3.0, 4.0], [0.3, 0.4]]), 1.0).round(6).tolist()
    [0.9, 1.2]
    """
    values = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(values, axis=1, keepdims=True)
    scale = np.minimum(1.0, row_bound / np.maximum(norms, np.finfo(np.float64).tiny))
    return (values * scale).sum(axis=0)


def noise_std(noise_multiplier: float, clipping_norm: float) -> float:
    """The noise's standard deviation: ``noise_multiplier * clipping_norm``.

    Flower's ``compute_stdv(z, C, m)`` divides by ``m`` because its release is
    a mean of ``m`` clipped updates (sensitivity ``C / m``); here the weight is
    inside each clipped contribution and the release is their sum
    (sensitivity ``C``), hence ``m = 1``.

    Examples
    --------
    >>> noise_std(1.5, 2.0)
    3.0
    """
    return compute_stdv(noise_multiplier, clipping_norm, 1)


def add_gaussian_noise(
    arrays: Contribution, std: float, rng: np.random.Generator
) -> None:
    """Add ``N(0, std^2)`` to every entry of ``arrays``, in place.

    Flower's ``add_gaussian_noise_inplace`` draws from NumPy's global state,
    which a seeded simulation makes predictable; ``rng`` is the caller's.

    Examples
    --------
    >>> arrays = [np.zeros(3)]
    >>> add_gaussian_noise(arrays, 0.0, np.random.default_rng(0))
    >>> arrays[0].tolist()
    [0.0, 0.0, 0.0]
    """
    for array in arrays:
        array += rng.normal(0.0, std, array.shape)


def poisson_sample_size(rate: float, population_size: int) -> int:
    """The expected sample size whose rate is at least ``rate`` (rounded up).

    Flower's ``GaussianPrivacyEvent`` states a Poisson rate as
    ``sample_size / population_size``; rounding up accounts a rate at least
    the true one, which can only raise epsilon.

    Examples
    --------
    >>> poisson_sample_size(0.1, 100), poisson_sample_size(0.101, 100)
    (10, 11)
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"rate must lie in (0, 1], got {rate}")
    # 1e-9 keeps 0.1 * 100 = 10.000000000000002 at 10.
    return min(population_size, math.ceil(rate * population_size - 1e-9))
