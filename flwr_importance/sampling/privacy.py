"""Private sample sizes for FedSampling (Qi et al., IJCAI 2023, Section 3.3).

FedSampling keeps every sample with probability ``K / N`` where ``N`` is the
total number of samples on the available clients.  The server never learns a
client's size: each client answers the size query by randomized response, and
the server estimates ``N`` from the sum of the replies.

Mechanism, for a size threshold ``M`` and privacy budget ``epsilon``:
``n = min(|D|, M - 1)``, ``x ~ Bernoulli(alpha)``, ``nhat ~ Uniform{1..M-1}``,
reply ``x n + (1 - x) nhat`` with ``alpha = (e^eps - 1) / (e^eps + M - 2)``.
A reply equals the true ``n`` with probability ``alpha + (1 - alpha)/(M - 1)``
and any other value of ``{1..M-1}`` with probability ``(1 - alpha)/(M - 1)``;
the ratio of the two is exactly ``e^eps``, hence epsilon-local differential
privacy (paper, Lemma 3.2): for any two true sizes ``n, n'`` and any reply
``y``, ``P(y | n) <= e^eps P(y | n')``.

Each round draws fresh randomness, so a node answering ``k`` size queries has
spent more than ``eps``: :func:`basic_composition_epsilon` and
:func:`advanced_composition_epsilon` bound what ``k`` answers spend together
(the ledger of :mod:`flwr_importance.sampling.ledger` applies them per node).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.validation import nonnegative_vector


def ldp_alpha(epsilon: float, max_size: int) -> float:
    """Probability ``alpha`` of answering truthfully for epsilon-LDP.

    ``alpha = (e^eps - 1) / (e^eps + M - 2)`` (paper, eq. 21), evaluated as
    ``(1 - e^-eps) / (1 + (M - 2) e^-eps)`` so that a large ``epsilon`` gives
    ``alpha -> 1`` instead of ``inf / inf``.

    Parameters
    ----------
    epsilon : float
        Privacy budget, positive and finite.
    max_size : int
        Size threshold ``M >= 3``: replies lie in ``{1..M-1}``.

    Returns
    -------
    float
        ``alpha`` in ``(0, 1)``.

    Raises
    ------
    ValueError
        If ``epsilon`` is not positive and finite or ``max_size`` is not an
        integer of at least 3.

    Examples
    --------
    >>> round(ldp_alpha(3.0, 100), 4)
    0.1616
    >>> ldp_alpha(1000.0, 100)
    1.0
    """
    _check_epsilon(epsilon)
    _check_max_size(max_size)
    decay = math.exp(-epsilon)
    return (1 - decay) / (1 + (max_size - 2) * decay)


def privatize_size(
    size: int, max_size: int, epsilon: float, rng: np.random.Generator
) -> int:
    """A client's randomized reply to the size query (paper, eq. 4).

    The reply is the true (clipped) size with probability ``alpha``, otherwise
    a uniform draw from ``{1..M-1}``; it satisfies epsilon-LDP for the size.

    **Decision:** sizes are clipped to ``[1, M - 1]``, not only above as in the
    paper: a client with no data would otherwise reply 0, a value no other
    client can produce, which reveals its size with certainty (unbounded
    privacy loss).  Such a client is counted as holding one sample.

    Parameters
    ----------
    size : int
        True number of samples ``|D| >= 0``.
    max_size : int
        Size threshold ``M >= 3`` (the paper's default is 100).
    epsilon : float
        Privacy budget, positive and finite (the paper's default is 3).
    rng : numpy.random.Generator
        Source of randomness; every call consumes one uniform and one integer.

    Returns
    -------
    int
        The reply, in ``{1..M-1}``.

    Raises
    ------
    ValueError
        If ``size`` is not a non-negative integer, or on invalid
        ``max_size``/``epsilon`` (see :func:`ldp_alpha`).

    Examples
    --------
    With a huge budget the reply is the clipped true size:

    >>> rng = np.random.default_rng(0)
    >>> privatize_size(40, 100, 1000.0, rng), privatize_size(0, 100, 1000.0, rng)
    (40, 1)
    """
    alpha = ldp_alpha(epsilon, max_size)
    clipped = _clipped_size(size, max_size)
    truthful = rng.random() < alpha
    random_size = int(rng.integers(1, max_size))
    return clipped if truthful else random_size


def size_reply_probabilities(
    size: int, max_size: int, epsilon: float
) -> NDArray[np.float64]:
    """Exact distribution of :func:`privatize_size`'s reply (paper, eqs. 17-18).

    Parameters
    ----------
    size : int
        True number of samples ``|D| >= 0``.
    max_size : int
        Size threshold ``M >= 3``.
    epsilon : float
        Privacy budget, positive and finite.

    Returns
    -------
    NDArray[np.float64]
        Vector of length ``M - 1``: entry ``y - 1`` is ``P(reply = y)``.

    Raises
    ------
    ValueError
        On invalid input, as :func:`privatize_size`.

    Examples
    --------
    A distribution whose true-size entry is ``e^eps`` times any other:

    >>> probs = size_reply_probabilities(40, 100, 3.0)
    >>> probs.shape, round(float(probs.sum()), 12)
    ((99,), 1.0)
    >>> bool(np.isclose(probs[39] / probs[0], math.exp(3.0)))
    True
    """
    alpha = ldp_alpha(epsilon, max_size)
    clipped = _clipped_size(size, max_size)
    probabilities = np.full(max_size - 1, (1 - alpha) / (max_size - 1))
    probabilities[clipped - 1] += alpha
    return probabilities


def estimate_total_size(responses: ArrayLike, max_size: int, epsilon: float) -> float:
    """Unbiased estimate of the clients' total size from their replies.

    ``N_tilde = (R - (1 - alpha) M |C| / 2) / alpha`` with ``R`` the sum of the
    ``|C|`` replies (paper, eq. 7).  A reply has mean
    ``alpha n + (1 - alpha) M / 2`` because ``nhat`` is uniform on
    ``{1..M-1}``, of mean ``M / 2``; so ``N_tilde`` is unbiased for the sum of
    the clipped sizes ``min(max(|D_c|, 1), M - 1)``, and its standard deviation
    grows like ``sqrt(|C|) M / alpha``.

    The estimate is not clamped: with few clients or a small ``epsilon`` it can
    be small or even negative.  The caller must clamp it (FedSampling's server
    uses at least the desired sample count ``K``) and log that it did.

    Parameters
    ----------
    responses : ArrayLike
        The clients' replies, integers in ``{1..M-1}``.
    max_size : int
        Size threshold ``M >= 3`` the clients used.
    epsilon : float
        Privacy budget the clients used.

    Returns
    -------
    float
        The estimate of the total size (0 for no replies).

    Raises
    ------
    ValueError
        If a reply is not an integer in ``{1..M-1}``, or on invalid
        ``max_size``/``epsilon``.

    Examples
    --------
    10,000 clients of 50 samples each, total 500,000:

    >>> rng = np.random.default_rng(0)
    >>> replies = [privatize_size(50, 100, 3.0, rng) for _ in range(10_000)]
    >>> round(estimate_total_size(replies, 100, 3.0) / 500_000, 2)
    0.97
    >>> estimate_total_size([10, 20, 30], 100, 50.0)
    60.0
    """
    alpha = ldp_alpha(epsilon, max_size)
    replies = nonnegative_vector("responses", responses)
    if np.any(replies != np.floor(replies)):
        raise ValueError("responses must be integers")
    if np.any((replies < 1) | (replies > max_size - 1)):
        raise ValueError(
            f"responses must lie in [1, {max_size - 1}], got range "
            f"[{replies.min():g}, {replies.max():g}]"
        )
    noise_mean = (1 - alpha) * max_size * replies.size / 2
    return float((replies.sum() - noise_mean) / alpha)


def basic_composition_epsilon(
    epsilon: float, num_queries: ArrayLike
) -> NDArray[np.float64]:
    """Privacy spent by ``k`` answers of an epsilon-DP mechanism: ``k eps``.

    Basic composition theorem (Dwork & Roth 2014, *The Algorithmic Foundations
    of Differential Privacy*, Theorem 3.16): mechanisms that are
    ``(eps_i, delta_i)``-DP compose into a ``(sum eps_i, sum delta_i)``-DP one,
    adaptively chosen queries included. The size reply is ``(eps, 0)``-LDP,
    so ``k`` replies of one node are ``(k eps, 0)``-LDP for its size.

    Parameters
    ----------
    epsilon : float
        Privacy budget of one answer, positive and finite.
    num_queries : ArrayLike
        ``k``, the answers given, non-negative integers (one per node).

    Returns
    -------
    NDArray[np.float64]
        ``k eps``, shaped like ``num_queries``.

    Raises
    ------
    ValueError
        If ``epsilon`` is not positive and finite or a count is not a
        non-negative integer.

    Examples
    --------
    >>> basic_composition_epsilon(3.0, [0, 1, 10])
    array([ 0.,  3., 30.])
    """
    _check_epsilon(epsilon)
    return epsilon * _query_counts(num_queries)


def advanced_composition_epsilon(
    epsilon: float, num_queries: ArrayLike, delta_prime: float
) -> NDArray[np.float64]:
    """Advanced composition theorem's epsilon for ``k`` epsilon-DP answers.

    Advanced composition theorem (Dwork, Rothblum & Vadhan 2010, *Boosting
    and Differential Privacy*; Dwork & Roth 2014, Theorem 3.20): ``k``
    adaptively chosen ``(eps, delta)``-DP mechanisms are together
    ``(eps', k delta + delta')``-DP for every ``delta' > 0``, with::

        eps' = sqrt(2 k ln(1/delta')) eps + k eps (e^eps - 1)

    The size reply has ``delta = 0``, so ``k`` replies are
    ``(eps', delta')``-LDP. This is the theorem's bound itself, which exceeds
    :func:`basic_composition_epsilon` for small ``k`` and for every ``k`` once
    ``eps >= ln 2`` (:func:`advanced_composition_crossover`); it is not the
    tightest known (Kairouz, Oh & Viswanath 2015 give the optimal one).

    Parameters
    ----------
    epsilon : float
        Privacy budget of one answer, positive and finite.
    num_queries : ArrayLike
        ``k``, the answers given, non-negative integers (one per node).
    delta_prime : float
        ``delta'``, the added failure probability, in ``(0, 1)``.

    Returns
    -------
    NDArray[np.float64]
        ``eps'``, shaped like ``num_queries`` (0 where ``k = 0``).

    Raises
    ------
    ValueError
        On an invalid ``epsilon`` or count (see
        :func:`basic_composition_epsilon`), or ``delta_prime`` outside
        ``(0, 1)``.

    Examples
    --------
    At ``eps = 0.1``, 1,000 answers and ``delta' = 1e-6``: about 27.1,
    against 100 by basic composition:

    >>> eps = advanced_composition_epsilon(0.1, [0, 1000], 1e-6)
    >>> [round(float(value), 2) for value in eps]
    [0.0, 27.14]
    """
    _check_epsilon(epsilon)
    _check_delta_prime(delta_prime)
    counts = _query_counts(num_queries)
    spread = np.sqrt(2 * counts * math.log(1 / delta_prime)) * epsilon
    return spread + counts * epsilon * math.expm1(epsilon)


def advanced_composition_crossover(epsilon: float, delta_prime: float) -> int | None:
    """Fewest answers from which advanced composition beats basic composition.

    :func:`advanced_composition_epsilon` is below ``k eps`` exactly when
    ``sqrt(2 ln(1/delta') / k) + e^eps - 1 < 1``, i.e. when ``e^eps < 2`` and
    ``k > 2 ln(1/delta') / (2 - e^eps)^2``. At ``eps >= ln 2`` (FedSampling's
    default ``eps = 3`` among them) it never does.

    Parameters
    ----------
    epsilon : float
        Privacy budget of one answer, positive and finite.
    delta_prime : float
        ``delta'``, in ``(0, 1)``.

    Returns
    -------
    int or None
        The smallest such ``k``; None if there is none.

    Raises
    ------
    ValueError
        On an invalid ``epsilon`` or ``delta_prime``.

    Examples
    --------
    >>> advanced_composition_crossover(0.1, 1e-6)
    35
    >>> advanced_composition_crossover(3.0, 1e-6) is None
    True
    """
    _check_epsilon(epsilon)
    _check_delta_prime(delta_prime)
    margin = 2 - math.exp(epsilon)
    if margin <= 0:
        return None
    return math.floor(2 * math.log(1 / delta_prime) / margin**2) + 1


def _query_counts(num_queries: ArrayLike) -> NDArray[np.float64]:
    """``num_queries`` as floats, each checked to be a non-negative integer."""
    counts = np.asarray(num_queries, dtype=np.float64)
    if not np.all(np.isfinite(counts) & (counts >= 0) & (counts == np.floor(counts))):
        raise ValueError(
            f"num_queries must be non-negative integers, got {num_queries!r}"
        )
    return counts


def _clipped_size(size: int, max_size: int) -> int:
    """The size a client reports truthfully: ``size`` clipped to ``[1, M-1]``."""
    if isinstance(size, bool) or int(size) != size or size < 0:
        raise ValueError(f"size must be a non-negative integer, got {size!r}")
    return min(max(int(size), 1), max_size - 1)


def _check_epsilon(epsilon: float) -> None:
    """Reject a privacy budget that is not a positive finite number."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be positive and finite, got {epsilon!r}")


def _check_delta_prime(delta_prime: float) -> None:
    """Reject a ``delta'`` outside ``(0, 1)``."""
    if not 0 < delta_prime < 1:
        raise ValueError(f"delta_prime must lie in (0, 1), got {delta_prime!r}")


def _check_max_size(max_size: int) -> None:
    """Reject a size threshold that leaves fewer than two possible replies."""
    if isinstance(max_size, bool) or int(max_size) != max_size or max_size < 3:
        raise ValueError(f"max_size must be an integer >= 3, got {max_size!r}")
