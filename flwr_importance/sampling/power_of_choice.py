"""Power-of-Choice's selection (Cho, Wang, Joshi, AISTATS 2022, Algorithm 1).

A round draws the candidate set ``A`` of ``d`` clients without replacement,
each draw proportional to size among the clients left
(:func:`draw_candidates`), then keeps the ``m`` candidates with the highest
local loss (:func:`select_highest`). The selection is biased on purpose
(docs/methods.md, §6); the strategy that runs it, with its loss query and its
plain mean, is :class:`~flwr_importance.strategies.power_of_choice.PowerOfChoice`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.validation import check_count


def draw_candidates(
    sizes: ArrayLike, d: int, rng: np.random.Generator
) -> NDArray[np.intp]:
    """``d`` distinct positions, each draw proportional to size among those left.

    The candidate set ``A`` of Power-of-Choice: ``d`` successive draws without
    replacement, the first with ``p_k = n_k / sum_l n_l`` and each next one
    from the same probabilities renormalised over the clients not yet drawn
    (NumPy's ``Generator.choice(..., replace=False, p=p)``). A client with no
    samples is never drawn.

    Parameters
    ----------
    sizes : array_like
        ``n_k``, each client's sample count (non-negative, finite).
    d : int
        Candidates to draw, at most the number of clients with ``n_k > 0``.
    rng : numpy.random.Generator
        The draws' generator.

    Returns
    -------
    numpy.ndarray
        The ``d`` positions in ``sizes``, in the order they were drawn.

    Raises
    ------
    ValueError
        Negative or non-finite sizes, ``d < 1``, or fewer positive sizes
        than ``d``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> sorted(draw_candidates([5, 0, 3, 2], 3, rng).tolist())
    [0, 2, 3]
    >>> draw_candidates([10, 0, 0], 1, rng).tolist()
    [0]
    """
    weights = np.asarray(sizes, dtype=np.float64)
    if weights.ndim != 1 or not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise ValueError("sizes must be a vector of finite, non-negative numbers")
    d = check_count("d", d)
    positive = int(np.count_nonzero(weights))
    if d > positive:
        raise ValueError(
            f"cannot draw {d} distinct candidates from {positive} sizes > 0"
        )
    drawn: NDArray[np.intp] = rng.choice(
        weights.size, size=d, replace=False, p=weights / weights.sum()
    )
    return drawn


def select_highest(losses: ArrayLike, m: int) -> NDArray[np.intp]:
    """The positions of the ``m`` highest losses, highest first.

    Ties go to the earlier position: with the candidates in the order they
    were drawn, to the candidate drawn first. ``+inf`` (a loss not known yet,
    ``rpow-d``) ranks above every finite loss. Fewer than ``m`` losses: all
    of them.

    Parameters
    ----------
    losses : array_like
        One loss per candidate; no NaN.
    m : int
        How many to keep (>= 1).

    Returns
    -------
    numpy.ndarray
        ``min(m, len(losses))`` positions in ``losses``.

    Raises
    ------
    ValueError
        ``losses`` is not a vector or holds NaN; ``m < 1``.

    Examples
    --------
    >>> select_highest([0.2, 0.9, 0.5, 0.9], 2).tolist()
    [1, 3]
    >>> select_highest([0.2, float("inf"), 0.5], 2).tolist()
    [1, 2]
    >>> select_highest([0.3], 2).tolist()
    [0]
    """
    values = np.asarray(losses, dtype=np.float64)
    if values.ndim != 1 or np.any(np.isnan(values)):
        raise ValueError("losses must be a vector without NaN")
    m = check_count("m", m)
    # A stable sort of the negated losses keeps equal losses in input order.
    order: NDArray[np.intp] = np.argsort(-values, kind="stable")
    return order[:m]
