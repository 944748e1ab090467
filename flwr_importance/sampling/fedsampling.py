"""FedSampling's data-level sampling (Qi et al., IJCAI 2023, Algorithm 1, l. 10-14).

Every client keeps each of its samples independently with probability
``K / N_tilde``, ``N_tilde`` being the server's private estimate of the total
size (:mod:`flwr_importance.sampling.privacy`); the server update is in
:mod:`flwr_importance.aggregation.fedsampling`.

How usable that estimate is, which the server checks each round because only
randomized replies reach it: a bound on its noise
(:func:`size_estimate_noise`), the nodes (:func:`nodes_for_usable_estimate`)
or the epsilon (:func:`epsilon_for_usable_estimate`) that make it usable, and
the binomial tail (:func:`binomial_upper_tail`) that tells a ``max_size``
clipping the sizes from chance.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from flwr_importance.validation import nonnegative_integer

__all__ = [
    "USABLE_NOISE_FRACTION",
    "bernoulli_keep",
    "binomial_upper_tail",
    "epsilon_for_usable_estimate",
    "keep_probability",
    "nodes_for_usable_estimate",
    "size_estimate_noise",
]

#: The size estimate is usable when its noise is at most this fraction of the
#: largest total its replies can stand for, ``C (M - 1)``: three standard
#: deviations then stay above zero.
USABLE_NOISE_FRACTION = 1 / 3


def keep_probability(samples_per_round: int, estimated_total_size: float) -> float:
    """Probability ``K / N_tilde`` with which a client keeps each of its samples.

    Parameters
    ----------
    samples_per_round : int
        The server's desired number of samples per round, ``K >= 1``.
    estimated_total_size : float
        The server's estimate ``N_tilde`` of the available clients' total size
        (eq. 2), already clamped to at least ``K`` by the server.

    Returns
    -------
    float
        ``K / N_tilde`` in ``(0, 1]``.

    Raises
    ------
    ValueError
        If ``K < 1`` or ``N_tilde`` is not finite or is below ``K`` (a server
        must clamp its estimate: a probability above one is no probability).

    Examples
    --------
    >>> keep_probability(64, 1000.0)
    0.064
    """
    if nonnegative_integer("samples_per_round", samples_per_round) < 1:
        raise ValueError("samples_per_round must be >= 1")
    if not (np.isfinite(estimated_total_size) and estimated_total_size >= 1):
        raise ValueError(
            f"estimated_total_size must be finite and >= 1, got {estimated_total_size}"
        )
    if estimated_total_size < samples_per_round:
        raise ValueError(
            f"estimated_total_size ({estimated_total_size:g}) is below "
            f"samples_per_round ({samples_per_round}): clamp it to at least K"
        )
    return samples_per_round / float(estimated_total_size)


def bernoulli_keep(
    num_samples: int, probability: float, rng: np.random.Generator
) -> NDArray[np.bool_]:
    """Independent keep decisions ``z_i ~ Bernoulli(K / N_tilde)`` (Algorithm 1, l. 12).

    Every sample of every client is kept independently with the same
    probability, which is what makes FedSampling data-level unbiased (the
    paper's Definition 3.1): the expected number of samples a round uses is
    ``K N / N_tilde``, i.e. ``K`` when the estimate is exact.

    Parameters
    ----------
    num_samples : int
        The client's number of samples ``|D_c| >= 0``.
    probability : float
        Keep probability in ``[0, 1]`` (see :func:`keep_probability`).
    rng : numpy.random.Generator
        Source of randomness; consumes ``num_samples`` uniforms.

    Returns
    -------
    NDArray[np.bool_]
        Mask of length ``num_samples``: ``True`` for the kept samples.

    Examples
    --------
    About ``K / N_tilde`` of the samples are kept:

    >>> kept = bernoulli_keep(10_000, 0.25, np.random.default_rng(0))
    >>> kept.shape, round(float(kept.mean()), 2)
    ((10000,), 0.25)
    """
    nonnegative_integer("num_samples", num_samples)
    if not 0 <= probability <= 1:
        raise ValueError(f"probability must lie in [0, 1], got {probability}")
    return rng.random(num_samples) < probability


def size_estimate_noise(num_replies: int, max_size: int, alpha: float) -> float:
    """A bound on the standard deviation of ``N_tilde`` (eq. 2 of the paper).

    A reply is the true clipped size ``n`` with probability ``alpha``, else
    uniform on ``{1..M-1}`` (variance below ``M^2 / 12``); with ``|n - M/2| <=
    M/2`` its variance is at most ``(1 - alpha) M^2 (1/12 + alpha/4)``, and
    ``N_tilde`` divides the sum of ``C`` replies by ``alpha``::

        sd(N_tilde) <= M / alpha * sqrt(C (1 - alpha) (1/12 + alpha/4))

    which grows like ``sqrt(C) M / alpha``.

    Parameters
    ----------
    num_replies : int
        ``C``, the size replies the estimate sums.
    max_size : int
        The size threshold ``M``.
    alpha : float
        The probability of a truthful reply, in ``(0, 1]``
        (:func:`~flwr_importance.sampling.privacy.ldp_alpha`).

    Returns
    -------
    float
        The bound, in samples.

    Examples
    --------
    At the defaults ``M = 100``, ``epsilon = 3``, 37 replies: against a total
    of at most ``37 * 99 = 3663`` samples, about a third of it.

    >>> from flwr_importance.sampling.privacy import ldp_alpha
    >>> round(size_estimate_noise(37, 100, ldp_alpha(3.0, 100)))
    1212
    """
    spread = (1 - alpha) * (1 / 12 + alpha / 4)
    return max_size / alpha * math.sqrt(num_replies * spread)


def nodes_for_usable_estimate(max_size: int, alpha: float) -> int:
    """The fewest nodes whose size estimate is usable.

    Usable: its noise is :data:`USABLE_NOISE_FRACTION` of ``C (M - 1)``, the
    total when every node holds ``M - 1`` samples or more.
    The noise grows like ``sqrt(C)`` and that total like ``C``; fewer samples
    per node need more nodes than this (the server cannot know how many).

    Parameters
    ----------
    max_size : int
        The size threshold ``M``.
    alpha : float
        The probability of a truthful reply, in ``(0, 1]``
        (:func:`~flwr_importance.sampling.privacy.ldp_alpha`).

    Returns
    -------
    int
        ``C``, the nodes.

    Examples
    --------
    At the defaults ``M = 100``, ``epsilon = 3``:

    >>> from flwr_importance.sampling.privacy import ldp_alpha
    >>> nodes_for_usable_estimate(100, ldp_alpha(3.0, 100))
    37
    """
    spread = (1 - alpha) * (1 / 12 + alpha / 4)
    ratio = max_size / (alpha * USABLE_NOISE_FRACTION * (max_size - 1))
    return math.ceil(spread * ratio**2)


def epsilon_for_usable_estimate(num_replies: int, max_size: int) -> float:
    """The smallest epsilon whose estimate from ``num_replies`` nodes is usable.

    Usable as in :func:`nodes_for_usable_estimate`: ``spread(alpha) / alpha^2``
    decreases in ``alpha`` (bisected), and ``alpha = (e^eps - 1) / (e^eps + M - 2)``
    gives ``e^eps = (1 + alpha (M - 2)) / (1 - alpha)``.

    Parameters
    ----------
    num_replies : int
        ``C``, the nodes that reply.
    max_size : int
        The size threshold ``M``.

    Returns
    -------
    float
        The epsilon.

    Examples
    --------
    100 nodes at ``M = 100`` need less than the default ``epsilon = 3``:

    >>> round(epsilon_for_usable_estimate(100, 100), 2)
    2.43
    """
    bound = num_replies * (USABLE_NOISE_FRACTION * (max_size - 1) / max_size) ** 2
    low, high = 1e-9, 1.0 - 1e-12
    for _ in range(100):
        alpha = (low + high) / 2
        if (1 - alpha) * (1 / 12 + alpha / 4) / alpha**2 > bound:
            low = alpha
        else:
            high = alpha
    return math.log((1 + high * (max_size - 2)) / (1 - high))


def binomial_upper_tail(successes: int, trials: int, probability: float) -> float:
    """``P(X >= successes)`` for ``X ~ Binomial(trials, probability)``, in log space.

    FedSampling's server compares the count of replies at ``M - 1`` with this
    tail, ``probability`` being the chance of such a reply from a node below
    ``M - 1`` samples, to tell a ``max_size`` that clips the sizes from chance.

    Parameters
    ----------
    successes : int
        The count whose tail is wanted; ``<= 0`` gives 1.
    trials : int
        The number of trials, ``>= 0``.
    probability : float
        The chance of a success, in ``(0, 1)``.

    Returns
    -------
    float
        The tail probability, in ``[0, 1]``.

    Raises
    ------
    ValueError
        ``probability`` outside ``(0, 1)`` when ``successes > 0`` (a math
        domain error).

    Examples
    --------
    8 heads or more in 10 fair tosses: ``(45 + 10 + 1) / 1024``.

    >>> round(binomial_upper_tail(8, 10, 0.5), 6)
    0.054688
    >>> binomial_upper_tail(0, 10, 0.5)
    1.0
    """
    if successes <= 0:
        return 1.0
    log_p, log_q = math.log(probability), math.log1p(-probability)
    log_trials = math.lgamma(trials + 1)
    return min(
        1.0,
        sum(
            math.exp(
                log_trials
                - math.lgamma(count + 1)
                - math.lgamma(trials - count + 1)
                + count * log_p
                + (trials - count) * log_q
            )
            for count in range(successes, trials + 1)
        ),
    )
