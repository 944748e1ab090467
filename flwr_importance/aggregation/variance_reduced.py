"""The unbiased estimator of OCS and MMFL: ``sum_{i in S} (d_i / p_i) U_i``.

Under independent participation with probabilities ``p_i`` (OCS) or
``p_{s|i}`` (MMFL, client ``i`` trains model ``s``), the sum over the
participants of ``(d_i / p_i) U_i`` is an unbiased estimate of the
full-participation update ``sum_i d_i U_i`` (slides, "MMFL optimal
variance-reduced sampling", eq. 5 and Algorithm 1 line 20; Chen, Horváth,
Richtárik, TMLR 2022, eq. 1).  ``d_i = n_i / sum_j n_j`` is client ``i``'s share
of the data (of model ``s``'s data in MMFL).  The probabilities come from
:mod:`flwr_importance.sampling.variance_reduced`; this module only weighs and sums.

**Decision:** ``U_i`` is the local model delta ``w_i - w`` and the server adds
``server_lr * estimate`` (the slides subtract ``eta * sum (d/p) U`` with ``U`` a
sum of gradients; with deltas the sign flips and a step of 1 is the authors'
setting, docs/methods.md §5).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.aggregation import weighted_sum
from flwr_importance.validation import nonnegative_vector, probability_array


def size_fractions(num_examples: ArrayLike) -> NDArray[np.float64]:
    """Data shares ``d_i = n_i / sum_j n_j``, per column for several models.

    Parameters
    ----------
    num_examples : ArrayLike
        ``n_i``, shape ``(N,)``, or ``n_{i,s}``, shape ``(N, S)``: nonnegative.

    Returns
    -------
    NDArray[np.float64]
        Same shape; each column sums to 1 (a column of zeros stays zero).

    Raises
    ------
    ValueError
        If an entry is negative or not finite, or the array is not 1-D or 2-D.

    Examples
    --------
    >>> size_fractions([1, 3]).tolist()
    [0.25, 0.75]
    >>> size_fractions([[1, 0], [3, 0]]).tolist()
    [[0.25, 0.0], [0.75, 0.0]]
    """
    sizes = np.asarray(num_examples, dtype=np.float64)
    if sizes.ndim not in (1, 2):
        raise ValueError(f"num_examples must be 1-D or 2-D, got shape {sizes.shape}")
    nonnegative_vector("num_examples", sizes.ravel())
    totals = sizes.sum(axis=0, keepdims=True)
    return np.divide(sizes, totals, out=np.zeros_like(sizes), where=totals > 0)


def unbiased_weights(fractions: ArrayLike, probs: ArrayLike) -> NDArray[np.float64]:
    """The participants' weights ``d_i / p_i`` of the unbiased estimator.

    Parameters
    ----------
    fractions : ArrayLike
        ``d_i`` of the participants, shape ``(K,)``, nonnegative.
    probs : ArrayLike
        The probabilities ``p_i`` with which they were sampled, shape ``(K,)``.
        A participant was drawn, so its probability must be positive.

    Returns
    -------
    NDArray[np.float64]
        ``d_i / p_i``, shape ``(K,)``.

    Raises
    ------
    ValueError
        If the shapes differ, a fraction is negative or a probability is not in
        ``(0, 1]``.

    Examples
    --------
    A participant drawn with probability 1/2 counts twice its data share:

    >>> unbiased_weights([0.25, 0.75], [0.5, 1.0]).tolist()
    [0.5, 0.75]
    """
    fractions_array = nonnegative_vector("fractions", fractions)
    probs_array = probability_array("probs", probs)
    if fractions_array.shape != probs_array.shape:
        raise ValueError(
            f"fractions and probs must have the same shape, got "
            f"{fractions_array.shape} and {probs_array.shape}"
        )
    if np.any(probs_array == 0):
        raise ValueError("a participant cannot have been sampled with probability 0")
    return fractions_array / probs_array


def unbiased_update(
    updates: Iterable[NDArray[np.floating]], fractions: ArrayLike, probs: ArrayLike
) -> NDArray[np.floating]:
    """``sum_{i in S} (d_i / p_i) U_i`` over the participants (slides eq. 5).

    Parameters
    ----------
    updates : Iterable[NDArray]
        The participants' flattened updates ``U_i``, at least one (a generator
        is summed one update at a time).
    fractions : ArrayLike
        Their data shares ``d_i``.
    probs : ArrayLike
        The probabilities with which they were sampled.

    Returns
    -------
    NDArray[np.floating]
        The estimate of the full-participation update ``sum_i d_i U_i``.

    Raises
    ------
    ValueError
        As :func:`unbiased_weights`, or for no updates or unequal lengths.

    Examples
    --------
    >>> updates = [np.array([1.0, 0.0]), np.array([0.0, 1.0])]
    >>> unbiased_update(updates, [0.25, 0.75], [0.5, 1.0]).tolist()
    [0.5, 0.75]
    """
    return weighted_sum(updates, unbiased_weights(fractions, probs))


def uniform_assignment_prob(num_clients: int, num_models: int, m: int) -> float:
    """``p = m / (N S)``: P(client i trains model s) under random assignment.

    ``m`` of the ``N`` clients are drawn without replacement, each given one of
    the ``S`` models uniformly (the MMFL baseline, docs/methods.md §5); ``m`` is
    clamped to ``N`` as in :func:`~flwr_importance.sampling.optimal_client_probs`.

    Raises
    ------
    ValueError
        If ``num_clients`` or ``num_models`` is below 1 or ``m`` is negative.

    Examples
    --------
    >>> uniform_assignment_prob(num_clients=10, num_models=2, m=4)
    0.2
    """
    if num_clients < 1 or num_models < 1 or m < 0:
        raise ValueError(
            f"need num_clients >= 1, num_models >= 1, m >= 0; got {num_clients}, "
            f"{num_models}, {m}"
        )
    return min(m, num_clients) / (num_clients * num_models)
