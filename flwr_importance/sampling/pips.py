"""Probability-proportional-to-size (pi-ps) sampling.

Inclusion probabilities proportional to a size measure, capped at 1, and three
ways of realizing a sample from probabilities: Hartley–Rao randomized
systematic sampling (a fixed number of distinct units, used by ISFedAvg at both
the client and the sample level, docs/methods.md §1), independent Bernoulli
(Poisson) participation (OCS/MMFL, docs/methods.md §5) and multinomial "MD"
sampling with replacement (the clustered-sampling baseline, docs/methods.md §4).

Every function is pure NumPy and draws its randomness from the
``numpy.random.Generator`` it is given.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.validation import (
    nonnegative_integer,
    nonnegative_vector,
    probability_array,
    probability_distribution,
    sample_count,
)

#: How far the inclusion probabilities may sum from an integer before
#: ``systematic_sample`` refuses them: float drift is far below this, a
#: genuinely fractional sample size is far above it.
INTEGER_TOTAL_TOLERANCE = 1e-6


def capped_inclusion_probs(weights: ArrayLike, m: int) -> NDArray[np.float64]:
    """Pi-ps inclusion probabilities: proportional to ``weights``, capped at 1.

    The result is the fixed point of iterative capping (units whose share
    ``m * w_i / sum(w)`` exceeds 1 get 1, the rest of the budget is shared over
    the others in proportion to their weights, repeat), computed in closed form
    in ``O(N log N)``: sort the positive weights ascending and take the largest
    ``k`` with ``0 < m - N + k <= sum_{j<=k} w_j / w_k``; the ``k`` smallest get
    ``(m - N + k) w_i / sum_{j<=k} w_j`` and the others 1.  This is also the
    single-model OCS closed form (docs/methods.md §5), which
    :func:`flwr_importance.sampling.variance_reduced.optimal_client_probs` reuses.

    Parameters
    ----------
    weights : ArrayLike
        Nonnegative size measures, shape ``(N,)``.  Zero weights get
        probability 0.
    m : int
        Expected sample size, an integer in ``[0, N]``.

    Returns
    -------
    NDArray[np.float64]
        Inclusion probabilities in ``[0, 1]`` summing to ``m``.

    Raises
    ------
    ValueError
        If the weights are not a finite nonnegative vector, ``m`` is not an
        integer in ``[0, N]``, or fewer than ``m`` weights are positive (only
        positive-weight units can be included, so ``m`` would be out of reach).

    Examples
    --------
    Equal weights give equal probabilities; a heavy unit is capped at 1 and the
    others share the rest of the budget; the probabilities sum to ``m``:

    >>> capped_inclusion_probs([1, 1, 1, 1], 2).tolist()
    [0.5, 0.5, 0.5, 0.5]
    >>> capped_inclusion_probs([1, 1, 8], 2).tolist()
    [0.5, 0.5, 1.0]
    >>> probs = capped_inclusion_probs([1, 2, 3, 0], 2)
    >>> np.round(probs, 3).tolist(), float(probs.sum())
    ([0.333, 0.667, 1.0, 0.0], 2.0)
    """
    weights = nonnegative_vector("weights", weights)
    m = sample_count("m", m, weights.size)
    positive = np.flatnonzero(weights)
    if positive.size < m:
        raise ValueError(
            f"only {positive.size} weights are positive, so no design can include "
            f"m={m} units on average"
        )
    probs = np.zeros_like(weights)
    if m == 0:
        return probs
    if m == positive.size:
        # Every positive unit is certain; the closed form below would give
        # k w / (k w), which rounds to 1 - 2.2e-16 for some equal weights.
        probs[positive] = 1.0
        return probs
    ascending = positive[np.argsort(weights[positive])]
    # Dividing by the largest weight keeps the running sums finite for weights
    # near the float maximum; the probabilities are scale-free.
    sizes = weights[ascending] / weights[ascending[-1]]
    running_totals = np.cumsum(sizes)
    budgets = m - sizes.size + np.arange(1, sizes.size + 1)
    # With n positive weights, feasibility is monotone in k once the budget is
    # positive and k = n - m + 1 is always feasible, so the last feasible k is
    # the one the closed form needs.
    feasible = (budgets > 0) & (budgets * sizes <= running_totals)
    uncapped = int(np.flatnonzero(feasible)[-1]) + 1
    probs[ascending[:uncapped]] = np.minimum(
        budgets[uncapped - 1] * sizes[:uncapped] / running_totals[uncapped - 1], 1.0
    )
    probs[ascending[uncapped:]] = 1.0
    return probs


def systematic_sample(
    inclusion_probs: ArrayLike, rng: np.random.Generator
) -> NDArray[np.intp]:
    """Hartley–Rao randomized systematic sampling without replacement.

    Units are put in a random order, laid end to end as intervals of length
    ``inclusion_probs[i]``, and one uniform start ``d ~ U[0, 1)`` selects the
    units whose interval holds ``d + j`` for ``j = 0..n-1`` (docs/methods.md §1).
    **Decision:** the order is shuffled (the randomized version of Hartley &
    Rao 1962), which leaves the first-order inclusion probabilities unchanged
    and excludes no pair of units because of where they sit.

    Units with probability exactly 1 are always selected.  The other intervals
    are laid on an integer grid (finer than 1e-9 for samples of up to a million
    units) whose total is exactly the sample size, so float drift can neither
    drop nor repeat a unit: every call returns exactly ``n`` distinct units.  A
    total that is off its integer by up to ``INTEGER_TOTAL_TOLERANCE`` is
    absorbed by rescaling the units below 1.

    Parameters
    ----------
    inclusion_probs : ArrayLike
        Target inclusion probabilities ``P(i in S)``, shape ``(N,)``, each in
        ``[0, 1]``, summing to an integer ``n`` (e.g. from
        :func:`capped_inclusion_probs`).
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    NDArray[np.intp]
        The ``n`` selected indices, distinct and sorted ascending.

    Raises
    ------
    ValueError
        If the probabilities are not a 1-D array in ``[0, 1]`` or their sum is
        more than ``INTEGER_TOTAL_TOLERANCE`` from an integer.

    Examples
    --------
    A unit with probability 1 is always in the sample, which has exactly
    ``sum(inclusion_probs)`` units:

    >>> systematic_sample([0.5, 0.5, 1.0], np.random.default_rng(0)).tolist()
    [0, 2]
    """
    probs = probability_array("inclusion_probs", inclusion_probs)
    total = float(probs.sum())
    sample_size = round(total)
    if abs(total - sample_size) > INTEGER_TOTAL_TOLERANCE:
        raise ValueError(
            f"inclusion_probs must sum to an integer sample size (within "
            f"{INTEGER_TOTAL_TOLERANCE:g}), got {total!r}"
        )
    certain = np.flatnonzero(probs == 1.0)
    shuffled = rng.permutation(np.flatnonzero(probs < 1.0))
    hits = _systematic_pass(probs[shuffled], sample_size - certain.size, rng)
    return np.sort(np.concatenate([certain, shuffled[hits]]))


def poisson_sample(probs: ArrayLike, rng: np.random.Generator) -> NDArray[np.intp]:
    """Independent Bernoulli (Poisson) participation.

    Unit ``i`` is selected with probability ``probs[i]`` independently of the
    others, so the sample size is random with mean ``sum(probs)``; this is how
    OCS clients decide to participate (docs/methods.md §5).

    Parameters
    ----------
    probs : ArrayLike
        Participation probabilities in ``[0, 1]``, shape ``(N,)``.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    NDArray[np.intp]
        Selected indices, sorted ascending.

    Raises
    ------
    ValueError
        If ``probs`` is not a 1-D array of values in ``[0, 1]``.

    Examples
    --------
    >>> poisson_sample([0.0, 1.0, 1.0, 0.0], np.random.default_rng(0)).tolist()
    [1, 2]
    """
    probs = probability_array("probs", probs)
    return np.flatnonzero(rng.random(probs.size) < probs)


def md_sample(p: ArrayLike, m: int, rng: np.random.Generator) -> NDArray[np.intp]:
    """Multinomial (MD) sampling: ``m`` i.i.d. draws with replacement from ``p``.

    The baseline of clustered sampling (docs/methods.md §4): a client drawn twice
    appears twice, and each index's expected count is ``m * p[i]``.

    Parameters
    ----------
    p : ArrayLike
        A probability distribution over the ``N`` units (nonnegative, summing
        to 1 within 1e-9), shape ``(N,)``.
    m : int
        Number of draws, an integer >= 0 (may exceed ``N``).
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    NDArray[np.intp]
        The ``m`` drawn indices in draw order.

    Raises
    ------
    ValueError
        If ``p`` is not a distribution or ``m`` is not a nonnegative integer.

    Examples
    --------
    Draws with replacement; a unit of probability 0 is never drawn:

    >>> md_sample([0.5, 0.5, 0.0], 6, np.random.default_rng(0)).tolist()
    [1, 0, 0, 0, 1, 1]
    """
    distribution = probability_distribution("p", p)
    draws = nonnegative_integer("m", m)
    return rng.choice(distribution.size, size=draws, p=distribution).astype(np.intp)


def _systematic_pass(
    lengths: NDArray[np.float64], sample_size: int, rng: np.random.Generator
) -> NDArray[np.intp]:
    """Positions in ``lengths`` hit by one systematic pass with ``sample_size`` points.

    Every length is below 1 and they sum to ``sample_size`` within
    ``INTEGER_TOTAL_TOLERANCE``.
    """
    if sample_size == 0:
        return np.empty(0, dtype=np.intp)
    # On an integer grid the interval bounds are exact: the widths add up to
    # exactly sample_size units and none exceeds one unit, which is what makes
    # the pass return exactly sample_size distinct units. Keeping
    # sample_size * ticks_per_unit below 2**52 keeps float-to-grid rounding exact.
    ticks_per_unit = 1 << (52 - sample_size.bit_length())
    grid_total = sample_size * ticks_per_unit
    running_totals = np.cumsum(lengths)
    bounds = np.rint(running_totals * (grid_total / running_totals[-1])).astype(
        np.int64
    )
    np.minimum(bounds, grid_total, out=bounds)
    bounds[-1] = grid_total
    widths = np.diff(bounds, prepend=0)
    excess = np.maximum(widths - ticks_per_unit, 0)
    if excess.any():
        # A unit within rounding (or within the total's tolerance) of 1 grew
        # past one unit: cap it and hand the excess to the first units, in the
        # random order, that still have room (there are at least sample_size
        # units with positive width, so the room suffices). Zero-width units
        # take none, so zero-probability units stay unselectable.
        widths -= excess
        shortfall = int(excess.sum())
        room = np.where(widths > 0, ticks_per_unit - widths, 0)
        np.minimum(room, shortfall, out=room)
        widths += np.clip(shortfall - (np.cumsum(room) - room), 0, room)
        bounds = np.cumsum(widths)
    start = rng.integers(ticks_per_unit)
    points = start + ticks_per_unit * np.arange(sample_size, dtype=np.int64)
    return np.searchsorted(bounds, points, side="right").astype(np.intp)
