"""ISFedAvg's probability maths.

Rizk, Vlaski, Sayed, "Optimal importance sampling for federated learning";
docs/methods.md §1.

Pure NumPy, shared by the strategy (client probabilities, eq. 28) and the
ClientApp (the ``sigma2_k`` report of eq. 22 and the realized sample
inclusion probabilities of eq. 8). The model aggregation itself is the plain
mean of eq. 5, :func:`flwr_importance.aggregation.mean`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.sampling.importance import update_sample_probs
from flwr_importance.sampling.pips import capped_inclusion_probs
from flwr_importance.validation import (
    distinct_indices,
    nonnegative_vector,
    probability_distribution,
    sample_count,
)

#: Default floor on a client's probability ``p_k``, as a fraction of ``1/K``.
#: The step of eq. 8 is scaled by ``1/(K p_k)``; a floor of ``0.1/K`` caps that
#: scaling at 10, which keeps a rarely selected client's step from blowing up
#: the model while leaving importance sampling free to favour others.
DEFAULT_MIN_RELATIVE_CLIENT_PROB = 0.1


def model_variability_weight(
    local_steps: ArrayLike, batch_sizes: ArrayLike
) -> NDArray[np.float64]:
    """``alpha_k = 3 + 6 / (E_k B_k)``, the weight of ``||grad P_k||^2`` (eq. 20, 27).

    Parameters
    ----------
    local_steps : ArrayLike
        ``E_k`` per client, each >= 1.
    batch_sizes : ArrayLike
        ``B_k`` per client, each >= 1, same shape as ``local_steps``.

    Returns
    -------
    NDArray[np.float64]
        ``alpha_k`` per client, in ``(3, 9]``.

    Raises
    ------
    ValueError
        If the shapes differ or a value is below 1 or not finite.

    Examples
    --------
    >>> model_variability_weight([1, 2], [1, 3]).tolist()
    [9.0, 4.0]
    """
    steps = np.asarray(local_steps, dtype=np.float64)
    sizes = np.asarray(batch_sizes, dtype=np.float64)
    if steps.shape != sizes.shape:
        raise ValueError(
            f"local_steps has shape {steps.shape}, batch_sizes {sizes.shape}"
        )
    if not (np.all(np.isfinite(steps)) and np.all(np.isfinite(sizes))):
        raise ValueError("local_steps and batch_sizes must be finite")
    if np.any(steps < 1) or np.any(sizes < 1):
        raise ValueError("local_steps and batch_sizes must be >= 1")
    return 3.0 + 6.0 / (steps * sizes)


def client_importance(
    sigma2: ArrayLike,
    gradient_sq_norms: ArrayLike,
    local_steps: ArrayLike,
    batch_sizes: ArrayLike,
) -> NDArray[np.float64]:
    """``sqrt(sigma2_k + alpha_k ||grad P_k||^2)``, the numerator of eq. 27/28.

    Parameters
    ----------
    sigma2 : ArrayLike
        ``sigma2_{s,k}`` per client (eq. 22), nonnegative.
    gradient_sq_norms : ArrayLike
        ``||grad P_k_hat||^2`` per client (eq. 14), nonnegative.
    local_steps, batch_sizes : ArrayLike
        ``E_k`` and ``B_k`` per client (see :func:`model_variability_weight`).

    Returns
    -------
    NDArray[np.float64]
        One nonnegative importance per client.

    Raises
    ------
    ValueError
        If an input is negative, not finite, or the shapes differ.

    Examples
    --------
    >>> client_importance([0.0, 1.0], [1.0, 0.0], [1, 1], [1, 1]).tolist()
    [3.0, 1.0]
    """
    variances = nonnegative_vector("sigma2", sigma2)
    sq_norms = nonnegative_vector("gradient_sq_norms", gradient_sq_norms)
    alphas = model_variability_weight(local_steps, batch_sizes)
    if not variances.shape == sq_norms.shape == alphas.shape:
        raise ValueError(
            f"sigma2 {variances.shape}, gradient_sq_norms {sq_norms.shape} and "
            f"local_steps/batch_sizes {alphas.shape} must have one entry per client"
        )
    return np.sqrt(variances + alphas * sq_norms)


def update_client_probs(
    client_probs: ArrayLike,
    participants: ArrayLike,
    sigma2: ArrayLike,
    gradient_sq_norms: ArrayLike,
    local_steps: ArrayLike,
    batch_sizes: ArrayLike,
    min_relative_prob: float = DEFAULT_MIN_RELATIVE_CLIENT_PROB,
) -> NDArray[np.float64]:
    """Eq. 28: move the participants' probabilities to their importances.

    ``p_k <- c sqrt(sigma2_k + alpha_k ||grad P_k_hat||^2)`` for ``k`` among the
    participants, with ``c`` such that they keep their total
    ``1 - sum_{l not in S} p_l``; the other clients keep their values. Then
    (**Decision**, docs/methods.md §1) every ``p_k`` is floored at
    ``min_relative_prob / K`` and the vector renormalized, so that no client
    starves. This is the update of eq. 29 over clients instead of samples, so
    it is computed by :func:`flwr_importance.sampling.update_sample_probs`. If
    every participant's importance is 0 they keep their old probabilities.

    Parameters
    ----------
    client_probs : ArrayLike
        Current normalized inclusion probabilities ``p_k``, shape ``(K,)``,
        summing to 1. Not modified.
    participants : ArrayLike
        Distinct indices into ``client_probs`` of the clients that reported.
    sigma2, gradient_sq_norms, local_steps, batch_sizes : ArrayLike
        Per participant, in the order of ``participants`` (see
        :func:`client_importance`).
    min_relative_prob : float, default 0.1
        Floor as a fraction of ``1/K``, in ``[0, 1]``; 0 disables it.

    Returns
    -------
    NDArray[np.float64]
        The updated client probabilities ``p_k``, a new array summing to 1.

    Raises
    ------
    ValueError
        If ``client_probs`` is not a distribution, ``participants`` repeats or
        leaves the range, a statistic is negative or not finite, or the
        lengths differ.

    Examples
    --------
    Participants 0 and 1 keep their total 0.5, split 3:1 as their importances:

    >>> update_client_probs(
    ...     [0.25] * 4, [0, 1], [0.0, 1.0], [1.0, 0.0], [1, 1], [1, 1],
    ...     min_relative_prob=0,
    ... ).tolist()
    [0.375, 0.125, 0.25, 0.25]
    """
    probs = probability_distribution("client_probs", client_probs)
    indices = distinct_indices("participants", participants, probs.size)
    importances = client_importance(sigma2, gradient_sq_norms, local_steps, batch_sizes)
    if importances.shape != indices.shape:
        raise ValueError(
            f"{indices.size} participants but {importances.size} sets of statistics"
        )
    return update_sample_probs(probs, indices, importances, min_relative_prob)


def realized_normalized_probs(
    probs: ArrayLike, sample_size: int
) -> NDArray[np.float64]:
    """The normalized inclusion probabilities a size-``m`` sample really has.

    The design includes unit ``i`` with probability ``min(1, m p_i)`` capped
    and redistributed (:func:`flwr_importance.sampling.capped_inclusion_probs`);
    dividing by ``m`` gives the normalized inclusion probability ``P(i in S)/m``
    of eq. 2. It equals ``p_i`` unless some ``m p_j > 1``. The importance
    weights ``1/(K p_k)`` and ``1/(N_k p_b)`` of eq. 7-8 are unbiased only with
    these realized values, so the strategy sends them as ``p_k`` and the client
    divides by them.

    Parameters
    ----------
    probs : ArrayLike
        Target normalized inclusion probabilities, shape ``(N,)``, summing to 1.
    sample_size : int
        ``m`` (``L`` clients or ``B_k`` samples), an integer in ``[1, N]`` not
        above the number of positive ``probs``.

    Returns
    -------
    NDArray[np.float64]
        Probabilities summing to 1, each at most ``1/m``.

    Raises
    ------
    ValueError
        If ``probs`` is not a distribution or ``sample_size`` is out of range.

    Examples
    --------
    ``2 p_0 = 1.4`` is capped at 1, so ``p_0`` is really 1/2:

    >>> np.round(realized_normalized_probs([0.7, 0.1, 0.1, 0.1], 2), 4).tolist()
    [0.5, 0.1667, 0.1667, 0.1667]
    """
    distribution = probability_distribution("probs", probs)
    size = sample_count("sample_size", sample_size, distribution.size)
    if size == 0:
        raise ValueError("sample_size must be >= 1")
    return capped_inclusion_probs(distribution, size) / size


def local_gradient_variance(
    sample_probs: ArrayLike,
    last_grad_norms: ArrayLike,
    seen: ArrayLike,
    local_steps: int,
    batch_size: int,
) -> float:
    """``sigma2_k = 6/(E_k B_k N_k^2) sum_n (1/p_n) ||grad Q_n||^2`` (eq. 22).

    The paper evaluates the norms at ``w^o``; a client only knows the norms it
    has seen. **Decision** (docs/methods.md §1): each sample takes the last norm the
    client computed for it, and samples never seen take the mean squared norm
    of the seen ones.

    Parameters
    ----------
    sample_probs : ArrayLike
        Normalized inclusion probabilities ``p_n``, shape ``(N,)``, positive,
        summing to 1 (the realized ones, :func:`realized_normalized_probs`).
    last_grad_norms : ArrayLike
        The last ``||grad Q_n||`` computed for each sample, shape ``(N,)``;
        entries where ``seen`` is False are ignored (they may be NaN).
    seen : ArrayLike
        Boolean mask, shape ``(N,)``: which samples have a norm. At least one.
    local_steps, batch_size : int
        ``E_k`` and ``B_k``, each >= 1.

    Returns
    -------
    float
        ``sigma2_k``, nonnegative.

    Raises
    ------
    ValueError
        If the shapes differ, a probability is not positive, no sample was
        seen, a seen norm is negative or not finite, or ``E_k``/``B_k`` < 1.

    Examples
    --------
    The unseen sample takes the seen one's squared norm:

    >>> local_gradient_variance([0.5, 0.5], [1.0, np.nan], [True, False], 1, 1)
    6.0
    """
    probs = probability_distribution("sample_probs", sample_probs)
    seen_mask = np.asarray(seen, dtype=bool)
    norms = np.asarray(last_grad_norms, dtype=np.float64)
    if not probs.shape == seen_mask.shape == norms.shape:
        raise ValueError(
            f"sample_probs {probs.shape}, last_grad_norms {norms.shape} and seen "
            f"{seen_mask.shape} must have one entry per sample"
        )
    if np.any(probs <= 0):
        raise ValueError("sample_probs must be positive (1/p_n appears in eq. 22)")
    if not seen_mask.any():
        raise ValueError("no sample has a gradient norm yet")
    sq_norms = nonnegative_vector("last_grad_norms[seen]", norms[seen_mask]) ** 2
    filled = np.full(probs.size, sq_norms.mean())
    filled[seen_mask] = sq_norms
    if local_steps < 1 or batch_size < 1:
        raise ValueError(
            f"local_steps and batch_size must be >= 1, got {local_steps}, {batch_size}"
        )
    return float(
        6.0 / (local_steps * batch_size * probs.size**2) * np.sum(filled / probs)
    )
