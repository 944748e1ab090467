"""The ``report_cap`` option: reported sizes, norms and statistics bounded by peers'.

The strategies that sample by what nodes report about themselves (OCS, AOCS
and MMFL: update norms or losses and sizes; MD, clustered sampling and
Power-of-Choice: sizes; ISFedAvg: its gradient statistics) take a keyword-only
``report_cap``: None (the default) leaves every report, draw and number as it
was; a number ``c > 1`` clips each report above ``c`` times the round's lower
median of that quantity (over the nodes that answered) to that bound, logged
by node (:func:`~flwr_importance.sampling.reports.cap_reports`). What one dishonest
node can reach with and without it: docs/deployment.md, section "A dishonest
node's reach".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from logging import WARNING
from numbers import Real
from typing import Any

import numpy as np
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_importance.sampling.reports import report_bounds


def check_report_cap(report_cap: Any) -> float | None:
    """``report_cap`` as a float, once checked to be None or a finite number > 1.

    Raises
    ------
    TypeError
        ``report_cap`` is neither None nor a real number (a bool is not one).
    ValueError
        ``report_cap`` is not finite or not above 1.
    """
    if report_cap is None:
        return None
    if isinstance(report_cap, bool) or not isinstance(report_cap, Real):
        raise TypeError(f"report_cap must be a number > 1 or None, got {report_cap!r}")
    value = float(report_cap)
    if not (math.isfinite(value) and value > 1):
        raise ValueError(
            "report_cap must be a finite number > 1 (the multiple of the round's "
            f"median report a node may reach), or None for no bound; got {report_cap}"
        )
    return value


def report_cap_setting(report_cap: float | None) -> dict[str, object]:
    """The summary line of ``report_cap``: its factor, or nothing when off."""
    if report_cap is None:
        return {}
    return {"Report cap": f"{report_cap:g} x the round's median report"}


def bound_reports(
    values: NDArray[Any],
    report_cap: float | None,
    node_ids: Sequence[int],
    quantity: str,
    context: str,
) -> NDArray[Any]:
    """``values`` with each report clipped at ``report_cap`` times its column's median.

    ``values`` holds one row per node of ``node_ids`` (one column per model or
    quantity when 2-D). Without a cap it is returned as it is, the same
    object, so the default path changes nothing. Each clipped report is
    logged at WARNING, naming the node, the quantity (``quantity-<s>`` for
    column ``s`` of a 2-D array) and the factor.
    """
    if report_cap is None:
        return values
    array = np.asarray(values, dtype=np.float64)
    bounds = report_bounds(array, report_cap)
    capped: NDArray[np.float64] = np.minimum(array, bounds)
    rows = array.reshape(array.shape[0], int(np.prod(array.shape[1:])))
    limits = np.broadcast_to(bounds.reshape(-1), rows.shape)
    for row, column in np.argwhere(rows > limits):
        name = quantity if array.ndim == 1 else f"{quantity}-{column}"
        log(
            WARNING,
            "%s: node %d reported %s = %g, above report_cap = %g times the "
            "round's median (%g): counted as %g",
            context,
            node_ids[row],
            name,
            rows[row, column],
            report_cap,
            limits[row, column] / report_cap,
            limits[row, column],
        )
    return capped
