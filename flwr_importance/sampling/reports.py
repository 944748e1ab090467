"""Bounds on what nodes report: a reported value capped at a multiple of its peers'.

The methods that sample by a quantity each node reports about itself (a size,
an update norm, a loss, ISFedAvg's gradient statistics) let one dishonest node
draw probability mass or aggregation weight to itself by lying. Clipping each
report at ``factor`` times the round's median report limits what that node can
take to what an honest node reporting ``factor`` times the median would get
(docs/deployment.md, section "A dishonest node's reach").
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.validation import nonnegative_array

__all__ = ["cap_reports", "report_bounds"]


def report_bounds(values: ArrayLike, factor: float) -> NDArray[np.float64]:
    """``factor`` times the lower median of each column of ``values`` (inf if 0).

    The lower median (the ``ceil(n / 2)``-th smallest value) is used rather
    than the mean of the two middle values so that, with only two nodes, the
    liar cannot raise its own bound: one report out of ``n >= 2`` never moves
    it past an honest one. A column whose lower median is 0 has no scale to
    bound by: its bound is ``inf`` (nothing is clipped).

    Parameters
    ----------
    values : ArrayLike
        The reports, one row per node: shape ``(N,)`` or ``(N, S)`` (one
        column per quantity or model), finite and nonnegative.
    factor : float
        The multiple of the median a report may reach, finite and > 1.

    Returns
    -------
    NDArray[np.float64]
        The bound of each column: shape ``()`` for 1-D ``values``, ``(S,)``
        for 2-D; ``inf`` for a column without rows.

    Raises
    ------
    ValueError
        ``values`` is not 1-D or 2-D, not finite or negative, or ``factor``
        is not a finite number above 1.

    Examples
    --------
    >>> float(report_bounds([10.0, 12.0, 1e6], 5.0))
    60.0
    >>> float(report_bounds([10.0, 1e6], 5.0))
    50.0
    >>> report_bounds([[1.0, 0.0], [3.0, 0.0], [2.0, 7.0]], 2.0).tolist()
    [4.0, inf]
    """
    if not (np.isfinite(factor) and factor > 1):
        raise ValueError(f"factor must be a finite number > 1, got {factor}")
    array = np.asarray(values, dtype=np.float64)
    if array.ndim not in (1, 2):
        raise ValueError(f"values must be 1-D or 2-D, got shape {array.shape}")
    array = nonnegative_array("values", array, array.ndim)
    columns = array.reshape(array.shape[0], int(np.prod(array.shape[1:])))
    if columns.shape[0] == 0:
        bounds = np.full(columns.shape[1], np.inf)
    else:
        lower_median = np.sort(columns, axis=0)[(columns.shape[0] - 1) // 2]
        bounds = np.where(lower_median > 0, factor * lower_median, np.inf)
    return bounds.reshape(array.shape[1:])


def cap_reports(values: ArrayLike, factor: float) -> NDArray[np.float64]:
    """Clip each report above ``factor`` times its column's lower median to that bound.

    Parameters
    ----------
    values : ArrayLike
        The reports, shape ``(N,)`` or ``(N, S)``, finite and nonnegative.
    factor : float
        The multiple of the median a report may reach, finite and > 1.

    Returns
    -------
    NDArray[np.float64]
        A new array of ``values``' shape: ``min(value, report_bounds)``
        column by column (:func:`report_bounds`); values at or below their
        bound are returned exactly.

    Raises
    ------
    ValueError
        As :func:`report_bounds`.

    Examples
    --------
    One node reports a size a million times its peers'; with ``factor = 4``
    it counts as four times the median:

    >>> cap_reports([100, 120, 90, 1e8], 4.0).tolist()
    [100.0, 120.0, 90.0, 400.0]
    >>> cap_reports([[1.0, 5.0], [1.0, 5.0], [9.0, 6.0]], 2.0).tolist()
    [[1.0, 5.0], [1.0, 5.0], [2.0, 6.0]]
    """
    array = np.asarray(values, dtype=np.float64)
    return np.minimum(array, report_bounds(array, factor))
