"""Optimal variance-reduced client sampling: OCS (one model) and MMFL (several).

Clients participate independently, client ``i`` with probability ``p_i``, and
the server aggregates the unbiased ``sum_{i in S} (1 / p_i) d_i U_i``.  With
``u_i = ||d_i U_i||`` its variance is ``sum_i u_i^2 (1/p_i - 1)``
(:func:`estimator_variance`); minimizing it under ``sum_i p_i = m`` and
``p_i <= 1`` gives probabilities proportional to ``u_i``, capped at 1 (Chen,
Horváth, Richtárik, "Optimal Client Sampling for Federated Learning", TMLR
2022).  The multi-model form (Zhang et al. 2024) applies the same closed form
to each client's total norm and splits the result over models.  Specification:
docs/methods.md §5.

**Decision:** a budget ``m`` above the number of clients is clamped to it (every
client with a positive norm then participates surely): with a changing set of
available clients this is the natural reading of "at most m per round", and
docs/methods.md §5 says to clamp.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.sampling.pips import capped_inclusion_probs
from flwr_importance.validation import (
    ROW_SUM_TOLERANCE,
    nonnegative_integer,
    nonnegative_matrix,
    nonnegative_vector,
    probability_array,
)


def optimal_client_probs(norms: ArrayLike, m: int) -> NDArray[np.float64]:
    """Single-model optimal client sampling (OCS) probabilities.

    Sort the norms ascending and take the largest ``k`` with
    ``0 < m - N + k <= sum_{j<=k} u_j / u_k``; then
    ``p_i = (m - N + k) u_i / sum_{j<=k} u_j`` for the ``k`` smallest norms and
    ``p_i = 1`` for the others.  This is exactly pi-ps capping with the norms
    as sizes, so it is computed by
    :func:`flwr_importance.sampling.pips.capped_inclusion_probs`
    (``O(N log N)``).

    Edge cases (docs/methods.md §5): clients with norm 0 get ``p = 0`` and take
    no part in the search for ``k``; ``m >= N`` saturates every client with a
    positive norm; if fewer than ``m`` norms are positive, those clients get
    ``p = 1`` and the total is below ``m``, which is optimal (a zero-norm client
    contributes nothing to estimate).

    Parameters
    ----------
    norms : ArrayLike
        ``u_i = ||d_i U_i||`` for each client, shape ``(N,)``, nonnegative.
    m : int
        Expected number of participants, an integer >= 0 (clamped to ``N``).

    Returns
    -------
    NDArray[np.float64]
        Participation probabilities in ``[0, 1]`` summing to
        ``min(m, number of positive norms)``.

    Raises
    ------
    ValueError
        If ``norms`` is not a finite nonnegative vector or ``m`` is not a
        nonnegative integer.

    Examples
    --------
    Equal norms give equal probabilities; a large norm saturates at 1; the
    probabilities sum to ``m``:

    >>> optimal_client_probs([1, 1, 1, 1], 2).tolist()
    [0.5, 0.5, 0.5, 0.5]
    >>> np.round(optimal_client_probs([1, 1, 1, 10], 2), 3).tolist()
    [0.333, 0.333, 0.333, 1.0]
    >>> np.round(optimal_client_probs([0, 1, 1, 1], 2), 3).tolist()
    [0.0, 0.667, 0.667, 0.667]
    """
    norms = nonnegative_vector("norms", norms)
    budget = min(nonnegative_integer("m", m), int(np.count_nonzero(norms)))
    return capped_inclusion_probs(norms, budget)


def available_pool(
    node_ids: Iterable[int], pool_size: int, rng: np.random.Generator
) -> list[int]:
    """The round's available pool: ``n`` of the nodes, uniformly, without repeats.

    The authors' cross-device setting (their public code draws
    ``train_clients_per_round`` available clients uniformly each round, then
    samples among them): only the pool is asked for its update norms, so a
    round trains ``n`` nodes, not every one. Within the pool, ``d_i =
    n_i / sum_{j in pool} n_j`` (the authors' normalized form): given the
    pool the step is unbiased for the pool's weighted mean update, and over
    the pools (each node in it with probability ``n / N``) for the
    population's mean when the nodes' sizes are equal; with unequal sizes it
    is a ratio estimator of the population's weighted mean (docs/methods.md
    §5, "Available pool").

    Parameters
    ----------
    node_ids : Iterable[int]
        The connected nodes (Flower's node ids are unsigned 64-bit integers:
        they are kept as Python ints, and sorted first, so a draw depends
        only on the set and ``rng``).
    pool_size : int
        ``n >= 1``; every node when ``n`` is at least their number.
    rng : numpy.random.Generator
        The draw's generator.

    Returns
    -------
    list of int
        The pool, sorted.

    Raises
    ------
    ValueError
        If ``pool_size`` is not a positive integer.

    Examples
    --------
    >>> pool = available_pool([5, 1, 9, 7], 2, np.random.default_rng(0))
    >>> len(pool), set(pool) <= {1, 5, 7, 9}
    (2, True)
    >>> available_pool([2**64 - 1, 1], 5, np.random.default_rng(0))
    [1, 18446744073709551615]
    """
    size = nonnegative_integer("pool_size", pool_size)
    if size < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size}")
    nodes = sorted(int(node_id) for node_id in node_ids)
    if size >= len(nodes):
        return nodes
    return sorted(nodes[index] for index in rng.choice(len(nodes), size, replace=False))


def uniform_client_probs(
    num_clients: int, m: int, *, population_size: int | None = None
) -> NDArray[np.float64]:
    """Uniform independent participation: ``p_i = m / N`` for every client.

    The control of :func:`optimal_client_probs` at the same expected number
    of participants; ``m`` is clamped to ``N`` as there. It needs no norms.
    With ``population_size`` the rate is ``min(m, population_size) /
    population_size`` whatever ``num_clients`` is: McMahan et al.'s
    fixed-denominator sampling, where no client's probability depends on how
    many others answered (central DP).

    Parameters
    ----------
    num_clients : int
        ``N >= 0``.
    m : int
        Expected number of participants, an integer >= 0 (clamped to ``N``).

    Returns
    -------
    NDArray[np.float64]
        Shape ``(N,)``, every entry ``min(m, N) / N`` (empty when ``N = 0``).

    Raises
    ------
    ValueError
        If ``num_clients`` or ``m`` is not a nonnegative integer.

    Examples
    --------
    >>> uniform_client_probs(4, 2).tolist()
    [0.5, 0.5, 0.5, 0.5]
    >>> uniform_client_probs(2, 5).tolist()
    [1.0, 1.0]
    >>> uniform_client_probs(2, 2, population_size=8).tolist()
    [0.25, 0.25]
    """
    count = nonnegative_integer("num_clients", num_clients)
    population = (
        count
        if population_size is None
        else nonnegative_integer("population_size", population_size)
    )
    budget = min(nonnegative_integer("m", m), population)
    return np.full(count, budget / population if population else 0.0)


def mmfl_probs(norms: ArrayLike, m: int) -> NDArray[np.float64]:
    """Multi-model (MMFL) optimal probabilities ``p_{s|i}`` (client i trains model s).

    With ``M_i = sum_s u_is`` the client totals, ``q = optimal_client_probs(M, m)``
    and ``p_{s|i} = q_i u_is / M_i``, which is the MMFL closed form of
    docs/methods.md §5: for a fixed client total ``q_i``, Cauchy–Schwarz makes the
    proportional split optimal, leaving single-model OCS on ``M``
    (docs/methods.md §5).  Row sums are ``q_i <= 1`` and the total is ``m`` (less
    under the edge cases of :func:`optimal_client_probs`).

    Parameters
    ----------
    norms : ArrayLike
        ``u_is = ||d_is U_is||``, shape ``(N, S)``, nonnegative.
    m : int
        Expected number of active clients over all models, an integer >= 0
        (clamped to ``N``).

    Returns
    -------
    NDArray[np.float64]
        ``p_{s|i}``, shape ``(N, S)``; rows with ``M_i = 0`` are all zero.

    Raises
    ------
    ValueError
        If ``norms`` is not a finite nonnegative 2-D array or ``m`` is not a
        nonnegative integer.

    Examples
    --------
    Both clients have the total norm 4, so each participates with probability
    0.5, split over the models in proportion to its norms:

    >>> mmfl_probs([[1, 3], [2, 2]], 1).tolist()
    [[0.125, 0.375], [0.25, 0.25]]
    """
    norms = nonnegative_matrix("norms", norms)
    client_totals = norms.sum(axis=1, keepdims=True)
    client_probs = optimal_client_probs(client_totals[:, 0], m)
    model_shares = np.divide(
        norms, client_totals, out=np.zeros_like(norms), where=client_totals > 0
    )
    return client_probs[:, None] * model_shares


def assign_models(probs: ArrayLike, rng: np.random.Generator) -> NDArray[np.intp]:
    """Draw, independently per client, one model to train or idle.

    Client ``i`` trains model ``s`` with probability ``probs[i, s]`` and idles
    with probability ``1 - sum_s probs[i, s]`` (docs/methods.md §5, MMFL); one
    uniform per client is compared with the row's running totals.

    Parameters
    ----------
    probs : ArrayLike
        ``p_{s|i}``, shape ``(N, S)``, entries in ``[0, 1]``, row sums at most
        1 (+ ``ROW_SUM_TOLERANCE``).
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    NDArray[np.intp]
        Shape ``(N,)``: the model index each client trains, or -1 if it idles.

    Raises
    ------
    ValueError
        If ``probs`` is not 2-D, has entries outside ``[0, 1]`` or a row sum
        above 1.

    Examples
    --------
    >>> assign_models([[1, 0], [0, 1], [0, 0]], np.random.default_rng(0)).tolist()
    [0, 1, -1]
    """
    probs = probability_array("probs", probs, ndim=2)
    row_totals = probs.sum(axis=1)
    if np.any(row_totals > 1.0 + ROW_SUM_TOLERANCE):
        worst = int(np.argmax(row_totals))
        raise ValueError(
            f"probs rows must sum to at most 1, row {worst} sums to "
            f"{row_totals[worst]!r}"
        )
    running_totals = np.cumsum(probs, axis=1)
    uniforms = rng.random((probs.shape[0], 1))
    # The number of running totals at or below the uniform is the chosen model;
    # passing all S of them means the uniform fell in the idle share.
    models = np.count_nonzero(running_totals <= uniforms, axis=1)
    return np.where(models < probs.shape[1], models, -1).astype(np.intp)


def estimator_variance(norms: ArrayLike, probs: ArrayLike) -> float:
    """Variance of the unbiased estimator under independent participation.

    For ``sum_{i in S} (1/p_i) d_i U_i`` with independent participation, the
    expected squared error is ``sum_i u_i^2 (1/p_i - 1)`` with
    ``u_i = ||d_i U_i||``; for MMFL, ``sum_{i,s} u_is^2 (1/p_is - 1)`` summed
    over all models.  This is the objective OCS and MMFL minimize.

    Parameters
    ----------
    norms : ArrayLike
        ``u``, shape ``(N,)`` or ``(N, S)``, nonnegative.
    probs : ArrayLike
        Participation probabilities, same shape as ``norms``, in ``[0, 1]``.

    Returns
    -------
    float
        The variance; entries with ``u = 0`` contribute 0 whatever their
        probability, and a positive norm with probability 0 makes it infinite
        (that client's contribution can never be estimated).

    Raises
    ------
    ValueError
        If the shapes differ, ``norms`` has negative or non-finite entries or
        ``probs`` has entries outside ``[0, 1]``.

    Examples
    --------
    Full participation has no variance; OCS beats uniform sampling at the same
    expected number of participants:

    >>> estimator_variance([1, 2], [1, 1])
    0.0
    >>> norms = [1, 1, 1, 10]
    >>> estimator_variance(norms, [0.5] * 4)
    103.0
    >>> round(estimator_variance(norms, optimal_client_probs(norms, 2)), 6)
    6.0
    """
    norms_array = np.asarray(norms, dtype=np.float64)
    norms_array = (
        nonnegative_matrix("norms", norms_array)
        if norms_array.ndim == 2
        else nonnegative_vector("norms", norms_array)
    )
    probs_array = probability_array("probs", probs, ndim=norms_array.ndim)
    if probs_array.shape != norms_array.shape:
        raise ValueError(
            f"norms and probs must have the same shape, got {norms_array.shape} "
            f"and {probs_array.shape}"
        )
    contributing = norms_array > 0
    if np.any(probs_array[contributing] == 0):
        return float("inf")
    squared = norms_array[contributing] ** 2
    return float(np.sum(squared / probs_array[contributing] - squared))


#: Most secure sums of AOCS's totals in a round (each over new bounds).
AOCS_MAX_TOTALS_SUMS = 10


def aocs_start_factor(score_total: float, m: int) -> float:
    """AOCS's first broadcast: ``m / u``, where ``u = sum_i u_i`` (server side).

    Each client then starts from ``p_i = min(1, (m / u) u_i)``
    (:func:`aocs_client_probs`). The only use of the norms' total, which secure
    aggregation can reveal without any single norm.

    Parameters
    ----------
    score_total : float
        ``u``, the sum of the clients' ``u_i``.
    m : int
        The expected number of participants, already clamped to ``N``.

    Returns
    -------
    float
        ``m / u``, or 0 when ``u <= 0`` (no client has a positive norm, so no
        client can be sampled).

    Examples
    --------
    >>> aocs_start_factor(13.0, 2)
    0.15384615384615385
    >>> aocs_start_factor(0.0, 2)
    0.0
    """
    return m / score_total if score_total > 0 else 0.0


def aocs_client_probs(
    scores: ArrayLike, start_factor: float, scales: Iterable[float] = ()
) -> NDArray[np.float64]:
    """AOCS's client step: ``p_i`` from its own ``u_i`` and the broadcasts so far.

    ``p_i = min(1, start_factor u_i)``, then ``p_i = min(1, C p_i)`` for each
    broadcast rescaling ``C`` in turn. A client evaluates it on its own score;
    :func:`aocs_probs` on every score at once, so both give the same floats.

    Parameters
    ----------
    scores : ArrayLike
        ``u_i = ||d_i U_i||`` (any common positive multiple of them works with
        the matching ``start_factor``), nonnegative.
    start_factor : float
        :func:`aocs_start_factor` of the scores' total.
    scales : Iterable[float], default ()
        The rescalings ``C`` broadcast so far (:func:`aocs_next_scale`), in order.

    Returns
    -------
    NDArray[np.float64]
        The probabilities, same shape as ``scores``.

    Examples
    --------
    >>> aocs_client_probs([1.0, 10.0], 2 / 13).round(3).tolist()
    [0.154, 1.0]
    >>> aocs_client_probs([1.0, 10.0], 2 / 13, [6.5]).tolist()
    [1.0, 1.0]
    """
    probs = np.minimum(1.0, start_factor * np.asarray(scores, dtype=np.float64))
    for scale in scales:
        # Saturated clients stay at 1 because every broadcast scale is > 1.
        probs = np.minimum(1.0, scale * probs)
    return probs


def aocs_mass_terms(
    probs: ArrayLike,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Each client's share of AOCS's two sums: ``p_i`` and 1 if ``p_i < 1``, else 0.

    Summed over the clients (in the clear, or by secure aggregation) they
    give ``P``, the probability mass below 1, and ``I``, the number of
    clients below 1, which :func:`aocs_next_scale` needs.

    Examples
    --------
    >>> mass, below_one = aocs_mass_terms([0.25, 1.0, 0.5])
    >>> mass.tolist(), below_one.tolist()
    ([0.25, 0.0, 0.5], [1.0, 0.0, 1.0])
    """
    probs_array = np.asarray(probs, dtype=np.float64)
    below_one = probs_array < 1.0
    return np.where(below_one, probs_array, 0.0), below_one.astype(np.float64)


def aocs_saturated_scale(
    mass_below_one: float, num_saturated: float, m: int
) -> float | None:
    """AOCS's server step from the saturated count: ``C = (m - S) / P``, or None.

    ``S = #{i : p_i = 1}``, so ``m - S = m - N + I`` (:func:`aocs_next_scale`)
    without ``N``: under central DP ``P`` and ``S`` are noisy sums.

    Examples
    --------
    >>> aocs_saturated_scale(0.4615384615384615, 1, 2)
    2.166666666666667
    """
    if mass_below_one <= 0:
        return None
    scale = (m - num_saturated) / mass_below_one
    return scale if scale > 1.0 else None


def aocs_next_scale(
    mass_below_one: float, num_below_one: int, num_clients: int, m: int
) -> float | None:
    """AOCS's server step: the next rescaling ``C = (m - N + I) / P``, or None to stop.

    Parameters
    ----------
    mass_below_one : float
        ``P = sum_{i: p_i < 1} p_i``.
    num_below_one : int
        ``I = #{i : p_i < 1}``.
    num_clients : int
        ``N``.
    m : int
        The expected number of participants, already clamped to ``N``.

    Returns
    -------
    float or None
        ``C`` above 1; None when ``P <= 0`` or ``C <= 1`` (converged).

    Examples
    --------
    >>> aocs_next_scale(0.4615384615384615, 3, 4, 2)
    2.166666666666667
    >>> aocs_next_scale(1.0, 3, 4, 2) is None
    True
    """
    return aocs_saturated_scale(mass_below_one, num_clients - num_below_one, m)


#: ``(rows, row_bound) -> sum`` of client rows of L2 norm <= the bound: exact
#: (:func:`exact_report_sum`) or, under CentralDP, clipped, noised, accounted.
ReportSum = Callable[[NDArray[np.float64], float], NDArray[np.float64]]


def exact_report_sum(
    rows: NDArray[np.float64], row_bound: float
) -> NDArray[np.float64]:
    """The column sums of ``rows`` (one row per client); ``row_bound`` unused.

    Examples
    --------
    >>> exact_report_sum(np.array([[1.0, 0.0], [0.5, 1.0]]), 1.0).tolist()
    [1.5, 1.0]
    """
    # Column by column as one contiguous 1-D sum each: the floats of the
    # plain AOCS sums, which SecureAOCSWorkflow's steps reproduce exactly.
    columns = np.asarray(rows, dtype=np.float64).T
    return np.array([np.ascontiguousarray(column).sum() for column in columns])


def aocs_probs(
    norms: ArrayLike,
    m: int,
    max_iterations: int = 4,
    *,
    report_sum: ReportSum = exact_report_sum,
    score_bound: float = math.inf,
    population_size: int | None = None,
) -> NDArray[np.float64]:
    """Approximate OCS (AOCS): the privacy-friendly iteration towards OCS.

    The protocol of docs/methods.md §5 (AOCS), evaluated centrally but using
    the norms only through the sums the protocol reveals, with the very
    client and server steps that
    :class:`~flwr_importance.compat.secure_aocs.SecureAOCSWorkflow` runs under
    SecAgg+ (docs/privacy.md):

    1. total ``u = sum_i u_i`` (:func:`aocs_start_factor`); each client sets
       ``p_i = min(1, m u_i / u)`` (:func:`aocs_client_probs`);
    2. up to ``max_iterations`` times: the sums ``P = sum p_i`` and
       ``I = #{i : p_i < 1}`` over the clients below 1
       (:func:`aocs_mass_terms`) give ``C = (m - N + I) / P``
       (:func:`aocs_next_scale`); each client sets ``p_i = min(1, C p_i)``;
       stop once ``C <= 1``.

    In a deployment each client computes its own ``p_i`` and the sums come
    from secure aggregation, so the server learns ``u``, ``P`` and ``I`` but no
    individual norm.  The total never exceeds ``m``, probabilities only grow
    from one iteration to the next (so the variance only falls), and the
    iteration reaches the exact OCS probabilities once no new client saturates
    (at most ``N + 1`` iterations; about 6 in practice).

    Parameters
    ----------
    norms : ArrayLike
        ``u_i = ||d_i U_i||``, shape ``(N,)``, nonnegative.
    m : int
        Expected number of participants, an integer >= 0 (clamped to ``N``).
    max_iterations : int, default 4
        Number of rescaling rounds ``j_max`` (4 in the authors' script).
    report_sum : ReportSum, default exact_report_sum
        How each of the protocol's sums is taken: the total of the norms
        (rows ``[u_i]``, bound ``score_bound``), then per iteration the pair
        ``(P, S)`` (rows ``[p_i if p_i < 1 else 0, 1 if p_i = 1 else 0]``, at
        most one nonzero entry, at most 1: bound 1). CentralDP passes its
        noisy sums here.
    score_bound : float, default inf
        The public bound on each ``u_i`` that ``report_sum`` is told.
    population_size : int or None, default None
        Clamp ``m`` to this public count instead of ``N`` (central DP).

    Returns
    -------
    NDArray[np.float64]
        Participation probabilities in ``[0, 1]`` summing to at most ``m``.

    Raises
    ------
    ValueError
        If ``norms`` is not a finite nonnegative vector or ``m`` or
        ``max_iterations`` is not a nonnegative integer.

    Examples
    --------
    No iteration is the proportional start; one reaches OCS here:

    >>> np.round(aocs_probs([1, 1, 1, 10], 2, max_iterations=0), 3).tolist()
    [0.154, 0.154, 0.154, 1.0]
    >>> np.round(aocs_probs([1, 1, 1, 10], 2), 3).tolist()
    [0.333, 0.333, 0.333, 1.0]
    """
    norms = nonnegative_vector("norms", norms)
    population = norms.size if population_size is None else population_size
    budget = min(nonnegative_integer("m", m), population)
    rounds = nonnegative_integer("max_iterations", max_iterations)
    (score_total,) = report_sum(norms[:, None], score_bound)
    start_factor = aocs_start_factor(float(score_total), budget)
    probs = aocs_client_probs(norms, start_factor)
    for _ in range(rounds):
        mass, below_one = aocs_mass_terms(probs)
        mass_total, num_saturated = report_sum(
            np.column_stack([mass, 1.0 - below_one]), 1.0
        )
        scale = aocs_saturated_scale(float(mass_total), float(num_saturated), budget)
        if scale is None:
            break
        # The client step with a start factor of 1 is the rescaling alone.
        probs = aocs_client_probs(probs, 1.0, [scale])
    return probs
