"""ISFedAvg data-level importance sampling, client side (docs/methods.md §1).

Each client keeps a probability ``p_n`` per local sample (summing to 1), draws
its mini-batches of distinct samples with ``P(n in B) = min(1, B p_n)``
(capped and redistributed) and, after each step, moves the batch's
probabilities towards the per-sample gradient norms (Rizk, Vlaski, Sayed,
eq. 29).  Pure NumPy: the gradient norms come from the caller.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.sampling.pips import capped_inclusion_probs, systematic_sample
from flwr_importance.validation import (
    distinct_indices,
    nonnegative_vector,
    probability_distribution,
    sample_count,
)

#: Default floor on every sample probability, relative to the uniform ``1/N``.
DEFAULT_MIN_RELATIVE_PROB = 1e-6


def importance_batch(
    sample_probs: ArrayLike, batch_size: int, rng: np.random.Generator
) -> NDArray[np.intp]:
    """Draw a mini-batch of distinct samples with ``P(n in B) = B p_n``.

    This is the inclusion probability under which the estimator of eq. 7 is
    unbiased: the step of eq. 8 divides each gradient by ``B N p_b``.  Where
    ``B p_n > 1`` it is capped at 1 with the excess redistributed
    (:func:`~flwr_importance.sampling.pips.capped_inclusion_probs`), and an
    unbiased step must then divide by the capped probability from that
    function rather than by ``B p_b``.  The sample is realized by Hartley–Rao
    randomized systematic sampling
    (:func:`~flwr_importance.sampling.pips.systematic_sample`).

    Parameters
    ----------
    sample_probs : ArrayLike
        The client's per-sample probabilities ``p_n``, shape ``(N,)``,
        nonnegative, summing to 1.
    batch_size : int
        ``B``, an integer in ``[0, N]``, at most the number of positive
        ``p_n``.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    NDArray[np.intp]
        The ``batch_size`` sample indices, distinct and sorted ascending.

    Raises
    ------
    ValueError
        If ``sample_probs`` is not a distribution, or ``batch_size`` is not an
        integer in ``[0, N]`` or exceeds the number of positive probabilities.

    Examples
    --------
    Only samples with a positive probability can be drawn, each at most once:

    >>> importance_batch([0.5, 0.5, 0.0, 0.0], 2, np.random.default_rng(0)).tolist()
    [0, 1]
    >>> importance_batch([0.1, 0.2, 0.3, 0.4], 2, np.random.default_rng(0)).tolist()
    [1, 2]
    """
    probs = probability_distribution("sample_probs", sample_probs)
    batch_size = sample_count("batch_size", batch_size, probs.size)
    return systematic_sample(capped_inclusion_probs(probs, batch_size), rng)


def update_sample_probs(
    sample_probs: ArrayLike,
    batch: ArrayLike,
    grad_norms: ArrayLike,
    min_relative_prob: float = DEFAULT_MIN_RELATIVE_PROB,
) -> NDArray[np.float64]:
    """Update the batch's sample probabilities from gradient norms (eq. 29).

    ``p_b <- c * ||grad Q(w; x_b)||`` for ``b`` in the batch, with ``c`` chosen
    so the batch keeps its total ``1 - sum_{n not in B} p_n``; the other
    samples keep their probabilities.  If every batch norm is 0 the batch keeps
    its old probabilities (eq. 29 has no ``c`` then).

    **Decision:** every probability is then floored at
    ``min_relative_prob / N`` and the vector renormalized to sum 1, so that no
    sample starves (a zero norm would otherwise exclude a sample for good, and
    its ``1 / p_b`` weight would blow up if it came back).  This is the same
    guard docs/methods.md prescribes for the client probabilities of eq. 28.

    Parameters
    ----------
    sample_probs : ArrayLike
        Current ``p_n``, shape ``(N,)``, nonnegative, summing to 1.  Not
        modified.
    batch : ArrayLike
        Distinct sample indices of the mini-batch, in ``[0, N)``.
    grad_norms : ArrayLike
        ``||grad Q(w; x_b)||`` for each index of ``batch``, nonnegative.
    min_relative_prob : float, default 1e-6
        Floor on every probability as a fraction of the uniform ``1/N``, in
        ``[0, 1]``; 0 disables the floor.

    Returns
    -------
    NDArray[np.float64]
        The updated probabilities, a new array summing to 1.

    Raises
    ------
    ValueError
        If ``sample_probs`` is not a distribution, ``batch`` has repeated or
        out-of-range indices, ``grad_norms`` is negative, non-finite or not
        the length of ``batch``, or ``min_relative_prob`` is outside
        ``[0, 1]``.

    Examples
    --------
    The batch {0, 1} keeps its total 0.5, split 1:3 as its gradient norms:

    >>> probs = update_sample_probs([0.25] * 4, [0, 1], [1.0, 3.0], min_relative_prob=0)
    >>> probs.tolist()
    [0.125, 0.375, 0.25, 0.25]
    """
    probs = probability_distribution("sample_probs", sample_probs).copy()
    batch_indices = distinct_indices("batch", batch, probs.size)
    norms = nonnegative_vector("grad_norms", grad_norms)
    if norms.shape != batch_indices.shape:
        raise ValueError(
            f"grad_norms must have one entry per batch index, got {norms.size} "
            f"norms for {batch_indices.size} indices"
        )
    if not 0.0 <= min_relative_prob <= 1.0:
        raise ValueError(
            f"min_relative_prob must lie in [0, 1], got {min_relative_prob!r}"
        )
    norm_total = norms.sum()
    if norm_total > 0:
        # The batch's old total equals 1 - sum_{n not in B} p_n.
        probs[batch_indices] = probs[batch_indices].sum() * norms / norm_total
    floored = np.maximum(probs, min_relative_prob / probs.size)
    return floored / floored.sum()
