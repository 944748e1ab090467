"""FedSampling's data-level sampling (Qi et al., IJCAI 2023, Algorithm 1, l. 10-14).

Every client keeps each of its samples independently with probability
``K / N_tilde``, ``N_tilde`` being the server's private estimate of the total
size (:mod:`flwr_importance.sampling.privacy`); the server update is in
:mod:`flwr_importance.aggregation.fedsampling`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from flwr_importance.sampling._checks import nonnegative_integer


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
