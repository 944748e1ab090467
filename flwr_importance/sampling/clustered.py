"""Clustered sampling of clients (Fraboni et al., ICML 2021).

Clustered sampling replaces the ``m`` i.i.d. draws of MD sampling by one draw
from each of ``m`` distributions ``W_1..W_m`` over the clients.  A distribution
matrix ``r`` of shape ``(m, N)`` is valid (the paper's Proposition 1) when

- every row sums to one: ``sum_i r[k, i] = 1``, and
- every client keeps its MD share: ``sum_k r[k, i] = m n_i / M_tot``;

then averaging the ``m`` drawn models is unbiased, and the variance of every
client's aggregation weight is at most MD sampling's.

Both algorithms work in integer *units* (paper, Appendix C): client ``i`` owns
``m n_i`` units, each distribution holds exactly ``M_tot = sum_i n_i`` units,
and ``r = units / M_tot``.  The integer arithmetic makes both properties hold
exactly before the final division.

- :func:`clustered_distributions_by_size` is Algorithm 1 (by sample size).
- :func:`clustered_distributions_by_similarity` is Algorithm 2 (by similarity
  of the clients' representative gradients, Ward hierarchical clustering;
  above :data:`EXACT_WARD_LIMIT` clients, the two-level clustering of
  :mod:`.scale.two_level`, which forms no ``N x N`` array).
- :func:`sample_from_distributions` draws one client from each distribution.

The distances Algorithm 2 clusters are in :mod:`.distances`; the sketch that
compresses its representative gradients is in :mod:`.scale.sketch`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.sampling.distances import (
    Distance,
    condensed_distances,
    pairwise_distances,
)
from flwr_importance.sampling.scale.two_level import two_level_tree
from flwr_importance.validation import (
    check_count,
    float_matrix,
    nonnegative_vector,
    probability_array,
    probability_rows,
    sample_count,
    symmetric_matrix,
)

# scipy is imported inside the functions that cluster, not here: it costs
# 0.25 s, half again the import of Flower's own strategies, and every strategy
# module imports the sampling package (most never cluster).

# Units are compared with float linkage heights and divided into floats: below
# 2**53 every unit count is an exact float64.
_MAX_EXACT_UNITS = 2**53

#: Above this many clients Algorithm 2 clusters in two levels
#: (:mod:`.scale.two_level`) instead of exact Ward on all pairs (docs/methods.md §4).
EXACT_WARD_LIMIT = 2_000


def clustered_distributions_by_size(sizes: ArrayLike, m: int) -> NDArray[np.float64]:
    """Algorithm 1: ``m`` sampling distributions built from the clients' sizes.

    Clients are taken by decreasing sample size and their ``m n_i`` units are
    poured into the distributions one after the other, each distribution
    holding ``M_tot`` units, so that clients of similar size share a
    distribution and a client spans at most two of them (beyond those it fills
    alone).

    Parameters
    ----------
    sizes : ArrayLike
        Sample count ``n_i >= 0`` of each of the ``N`` clients (integers, not
        all zero).
    m : int
        Number of clients drawn per round, ``1 <= m <= N``.

    Returns
    -------
    NDArray[np.float64]
        Distribution matrix ``r`` of shape ``(m, N)``: rows sum to one, column
        ``i`` sums to ``m n_i / M_tot``.  A client with ``m n_i >= M_tot`` owns
        ``floor(m n_i / M_tot)`` rows outright (drawn with probability one).

    Raises
    ------
    ValueError
        If ``sizes`` is not a vector of non-negative integers with a positive
        sum, or ``m`` is not an integer in ``[1, N]``.

    Examples
    --------
    Client 2 holds half the data, so it owns one distribution; clients 0 and 1
    share the other. Column ``i`` sums to ``m n_i / M_tot``:

    >>> r = clustered_distributions_by_size([10, 10, 20], 2)
    >>> r.tolist()
    [[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]]
    >>> r.sum(axis=0).tolist()
    [0.5, 0.5, 1.0]
    """
    units, total, m = _checked_units(sizes, m)
    table, open_rows, residual = _dedicate_heavy_clients(units, total, m)
    order = _by_decreasing_units(np.flatnonzero(residual), residual)
    seed_levels = np.zeros(open_rows.size, np.int64)
    _fill_greedily(table, open_rows, seed_levels, order, residual[order], total)
    return table / total


def clustered_distributions_by_similarity(
    sizes: ArrayLike,
    representative_grads: ArrayLike,
    m: int,
    distance: Distance = "arccos",
    *,
    exact_ward_limit: int = EXACT_WARD_LIMIT,
    seed: int = 0,
) -> NDArray[np.float64]:
    """Algorithm 2: ``m`` sampling distributions grouping similar clients.

    Similar clients share a distribution, so one draw per distribution spreads
    the round over dissimilar clients (in the paper's MNIST example with one
    digit per client, every round sees every digit once the tree has found the
    digits).  Steps:

    1. clients with ``m n_i >= M_tot`` first get ``floor(m n_i / M_tot)``
       distributions of their own, as the paper prescribes (end of Section 5);
       the rest of their units, below ``M_tot``, go through the steps below;
    2. Ward hierarchical clustering of the pairwise distances between the
       representative gradients of the clients with units left; with more
       than ``exact_ward_limit`` clients, the two-level clustering of
       :func:`~flwr_importance.sampling.scale.two_level.two_level_tree` instead
       (k-means into ``max(sqrt(n), m)`` groups, then Ward on their
       centroids: no ``N x N`` array; docs/methods.md §4);
    3. the tree is cut into its largest subtrees holding at most ``M_tot``
       units each, ``K`` groups (``K >= m`` since the units total
       ``m M_tot``);
    4. the heaviest groups seed the open distributions, one each; the clients
       of the other groups, group by group in decreasing weight, fill the room
       left, exactly as in Algorithm 1.

    Parameters
    ----------
    sizes : ArrayLike
        As in :func:`clustered_distributions_by_size`.
    representative_grads : ArrayLike
        Array of shape ``(N, d)``: row ``i`` is client ``i``'s last update
        (returned model minus the global model it started from), zeros for a
        client never sampled.  float32 input is kept float32 for the Gram
        matrix (half the memory of float64, cosines to about 1e-7).
    m : int
        As in :func:`clustered_distributions_by_size`.
    distance : {"arccos", "l2", "l1"}
        Dissimilarity between two gradients: angle between them (default, as
        in the paper's experiments), Euclidean or Manhattan distance.  Zero
        gradients are at angle 0 from each other and at angle pi/2 (orthogonal)
        from every non-zero gradient, so clients never sampled are grouped
        together, as the paper intends, and no NaN arises.
    exact_ward_limit : int
        Largest number of clients ``N`` clustered by exact Ward on all pairs
        (default :data:`EXACT_WARD_LIMIT`); above it, two levels.
    seed : int
        Seed of the two-level clustering's k-means (unused below the limit).

    Returns
    -------
    NDArray[np.float64]
        Distribution matrix ``r`` of shape ``(m, N)`` with the same exact
        properties as :func:`clustered_distributions_by_size`.

    Raises
    ------
    ValueError
        On invalid ``sizes`` or ``m`` (as for Algorithm 1), gradients that are
        not a finite ``(N, d)`` array (for ``arccos`` and ``l2``, also finite
        ones whose squared norms overflow), or an unknown ``distance``.

    Examples
    --------
    Clients 0 and 2 point one way, 1 and 3 the other: each pair shares a
    distribution, so a round draws one client of each direction.

    >>> grads = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0]]
    >>> clustered_distributions_by_similarity([1, 1, 1, 1], grads, 2).tolist()
    [[0.5, 0.0, 0.5, 0.0], [0.0, 0.5, 0.0, 0.5]]
    """
    units, total, m = _checked_units(sizes, m)
    grads = float_matrix("representative_grads", representative_grads, units.size)
    if units.size <= exact_ward_limit:
        return _allocate_by_similarity(
            units, total, m, _exact_ward_groups(pairwise_distances(grads, distance))
        )

    def tree(
        rows: NDArray[np.floating],
        active: NDArray[np.intp],
        units: NDArray[np.int64],
        total: int,
        level1: int,
    ) -> _Tree:
        return two_level_tree(rows, units, total, distance, groups=level1, seed=seed)

    return _allocate_by_similarity(units, total, m, _two_level_groups(grads, m, tree))


def clustered_distributions_from_distances(
    sizes: ArrayLike, distances: ArrayLike, m: int
) -> NDArray[np.float64]:
    """Algorithm 2 from a precomputed client distance matrix.

    The same as :func:`clustered_distributions_by_similarity` after the
    distances: a strategy can keep the ``(N, N)`` matrix between rounds and
    update only the rows of the clients that returned a new gradient (the
    paper's ``O(N m d)`` per round) instead of recomputing all of it.

    Parameters
    ----------
    sizes, m
        As in :func:`clustered_distributions_by_size`.
    distances : ArrayLike
        Symmetric ``(N, N)`` matrix of non-negative dissimilarities, e.g. from
        :func:`pairwise_distances`; the diagonal is ignored.

    Returns
    -------
    NDArray[np.float64]
        The matrix :func:`clustered_distributions_by_similarity` gives for
        gradients at these distances.

    Raises
    ------
    ValueError
        On invalid ``sizes`` or ``m`` (as for Algorithm 1), or if
        ``distances`` is not a finite, non-negative, symmetric ``(N, N)``
        matrix.

    Examples
    --------
    >>> grads = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0]]
    >>> distances = pairwise_distances(grads)
    >>> clustered_distributions_from_distances([1, 1, 1, 1], distances, 2).tolist()
    [[0.5, 0.0, 0.5, 0.0], [0.0, 0.5, 0.0, 0.5]]
    """
    units, total, m = _checked_units(sizes, m)
    matrix = symmetric_matrix("distances", distances, units.size)
    return _allocate_by_similarity(units, total, m, _exact_ward_groups(matrix))


def sample_from_distributions(
    distributions: ArrayLike, rng: np.random.Generator
) -> NDArray[np.int64]:
    """Draw one client from each distribution (one uniform per row).

    Parameters
    ----------
    distributions : ArrayLike
        Matrix of shape ``(m, N)`` with rows that are probability vectors.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    NDArray[np.int64]
        The ``m`` drawn client indices, row ``k``'s draw at position ``k``; a
        client may appear more than once.  A zero-probability client is never
        drawn.

    Raises
    ------
    ValueError
        If ``distributions`` is not 2-D with entries in [0, 1] and rows
        summing to one.

    Examples
    --------
    >>> rows = [[0.0, 0.0, 1.0], [0.5, 0.5, 0.0]]
    >>> sample_from_distributions(rows, np.random.default_rng(0)).tolist()
    [2, 0]
    """
    probabilities = probability_rows("distributions", distributions)
    cumulative = np.cumsum(probabilities, axis=1)
    # Scaling the uniform by the row's own total keeps the target inside the
    # row when float rounding leaves the total a hair below one.
    targets = rng.random(probabilities.shape[0]) * cumulative[:, -1]
    drawn = np.count_nonzero(cumulative <= targets[:, None], axis=1)
    # `targets` can round up to the row total itself; the last client with
    # positive probability is then the one the uniform belongs to.
    last_positive = (
        probabilities.shape[1] - 1 - np.argmax(probabilities[:, ::-1] > 0, axis=1)
    )
    return np.minimum(drawn, last_positive).astype(np.int64)


def aggregation_weight_variance(distributions: ArrayLike) -> NDArray[np.float64]:
    """Variance of each client's aggregation weight under clustered sampling.

    The weight of client ``i`` is ``omega_i = (times i is drawn) / m``; with
    one independent draw per distribution its variance is
    ``(1/m^2) sum_k r[k, i] (1 - r[k, i])`` (paper, eq. 16).

    Parameters
    ----------
    distributions : ArrayLike
        Distribution matrix of shape ``(m, N)``.

    Returns
    -------
    NDArray[np.float64]
        Vector of ``N`` variances.

    Raises
    ------
    ValueError
        If ``distributions`` is not a valid distribution matrix.

    Examples
    --------
    A client that owns a distribution has a certain weight:

    >>> r = clustered_distributions_by_size([10, 10, 20], 2)
    >>> aggregation_weight_variance(r).tolist()
    [0.0625, 0.0625, 0.0]
    """
    probabilities = probability_rows("distributions", distributions)
    draws = probabilities.shape[0]
    return np.sum(probabilities * (1 - probabilities), axis=0) / draws**2


def md_aggregation_weight_variance(p: ArrayLike, m: int) -> NDArray[np.float64]:
    """Variance of each client's aggregation weight under MD sampling.

    ``m`` i.i.d. draws with probabilities ``p`` give
    ``Var[omega_i] = p_i (1 - p_i) / m`` (paper, eq. 14); clustered sampling
    with the same ``p`` is never above it (eq. 17).

    Parameters
    ----------
    p : ArrayLike
        Probability of each client per draw (``n_i / M_tot``).
    m : int
        Number of draws, at least 1.

    Returns
    -------
    NDArray[np.float64]
        Vector of variances, one per client.

    Raises
    ------
    ValueError
        If ``p`` has entries outside [0, 1] or ``m`` is not a positive integer.

    Examples
    --------
    MD sampling with the same ``p`` as the clustered example of
    :func:`aggregation_weight_variance`: every variance is larger (eq. 17).

    >>> md_aggregation_weight_variance([0.25, 0.25, 0.5], 2).tolist()
    [0.09375, 0.09375, 0.125]
    """
    probabilities = probability_array("p", p)
    return probabilities * (1 - probabilities) / check_count("m", m)


def _checked_units(sizes: ArrayLike, m: int) -> tuple[NDArray[np.int64], int, int]:
    """Validate the inputs; return client units ``m n_i``, ``M_tot`` and ``m``."""
    counts = nonnegative_vector("sizes", sizes)
    if np.any(counts != np.floor(counts)):
        raise ValueError("sizes must be integer sample counts")
    total = int(counts.sum())
    if total == 0:
        raise ValueError("sizes must not all be zero")
    draws = sample_count("m", check_count("m", m), counts.size)
    if draws * total >= _MAX_EXACT_UNITS:
        raise ValueError(
            f"m * sum(sizes) = {draws * total} is too large for exact arithmetic "
            f"(limit 2**53)"
        )
    return draws * counts.astype(np.int64), total, draws


#: Groups of the clients with units left: ``(active clients, their units,
#: M_tot)`` to a group label ``0..K-1`` per client, none above ``M_tot``.
_Grouping = Callable[[NDArray[np.intp], NDArray[np.int64], int], NDArray[np.intp]]


def _exact_ward_groups(distances: NDArray[np.float64]) -> _Grouping:
    """Step 2 by Ward on all pairs of ``distances``, then the capacity cut."""

    def groups(
        active: NDArray[np.intp], units: NDArray[np.int64], total: int
    ) -> NDArray[np.intp]:
        from scipy.cluster.hierarchy import linkage  # scipy on first use, see top

        tree = linkage(condensed_distances(distances, active), method="ward")
        return _cut_by_capacity(tree, units, total)

    return groups


#: The two-level tree of the active clients: ``(their rows, their indices,
#: their units, M_tot, groups of level 1)`` to what
#: :func:`.scale.two_level.two_level_tree` returns.
_Tree = tuple[NDArray[np.float64], NDArray[np.intp], NDArray[np.int64]]
_TreeOf = Callable[
    [NDArray[np.floating], NDArray[np.intp], NDArray[np.int64], int, int], _Tree
]


def _two_level_groups(
    grads: NDArray[np.floating], m: int, tree_of: _TreeOf
) -> _Grouping:
    """Step 2 by the two-level clustering ``tree_of``, then the cut.

    The tree's leaves are blocks of clients, each within ``M_tot`` units: the
    cut groups whole blocks.
    """

    def groups(
        active: NDArray[np.intp], units: NDArray[np.int64], total: int
    ) -> NDArray[np.intp]:
        level1 = min(active.size, max(math.isqrt(active.size - 1) + 1, m))
        # Usually every client is active: no copy of the N x d gradients.
        rows = grads if active.size == grads.shape[0] else grads[active]
        tree, block, block_units = tree_of(rows, active, units, total, level1)
        if block_units.size == 1:
            return np.zeros(active.size, np.intp)
        return _cut_by_capacity(tree, block_units, total)[block]

    return groups


def _allocate_by_similarity(
    units: NDArray[np.int64], total: int, m: int, grouping: _Grouping
) -> NDArray[np.float64]:
    """Steps 1-4 of Algorithm 2 (see :func:`clustered_distributions_by_similarity`)."""
    table, open_rows, residual = _dedicate_heavy_clients(units, total, m)
    if open_rows.size == 0:
        return table / total

    # Clients without units left (no data, or all of it in dedicated rows)
    # take no part in the clustering.  With rows open, at least two clients
    # have units left, since each has fewer than M_tot of them.
    active = np.flatnonzero(residual)
    group = grouping(active, residual[active], total)

    group_units = np.zeros(group.max() + 1, np.int64)
    np.add.at(group_units, group, residual[active])
    # Stable sort: groups of equal weight keep label order (deterministic).
    groups_by_weight = np.argsort(-group_units, kind="stable")
    rank = np.empty_like(groups_by_weight)
    rank[groups_by_weight] = np.arange(groups_by_weight.size)
    client_rank = rank[group]

    seeds = client_rank < open_rows.size
    seeded_clients = active[seeds]
    table[open_rows[client_rank[seeds]], seeded_clients] = residual[seeded_clients]

    remaining = active[~seeds]
    order = remaining[
        np.lexsort((remaining, -residual[remaining], client_rank[~seeds]))
    ]
    seed_levels = group_units[groups_by_weight[: open_rows.size]]
    _fill_greedily(table, open_rows, seed_levels, order, residual[order], total)
    return table / total


def _dedicate_heavy_clients(
    units: NDArray[np.int64], total: int, m: int
) -> tuple[NDArray[np.int64], NDArray[np.intp], NDArray[np.int64]]:
    """Give each client ``floor(units_i / M_tot)`` distributions of its own.

    **Decision:** done first, for both algorithms.  The paper prescribes it for
    Algorithm 2 (end of Section 5); for Algorithm 1 the greedy pass alone does
    not guarantee it (with ``m n = (1.3, 1.2, ...) M_tot`` the second client
    straddles two distributions and is never drawn with certainty), while
    taking the full distributions out first leaves the other properties intact
    and lowers the heavy clients' weight variance.

    Returns
    -------
    tuple
        The ``(m, N)`` unit table with the dedicated rows filled, the indices
        of the rows still open, and each client's units left (``< M_tot``).
        The units left fill the open rows exactly: they total
        ``M_tot * len(open rows)``.
    """
    full_rows = units // total
    owners = np.repeat(np.arange(units.size), full_rows)
    table = np.zeros((m, units.size), np.int64)
    table[np.arange(owners.size), owners] = total
    return table, np.arange(owners.size, m), units - full_rows * total


def _by_decreasing_units(
    clients: NDArray[np.intp], units: NDArray[np.int64]
) -> NDArray[np.intp]:
    """``clients`` sorted by decreasing units, ties by index (deterministic)."""
    return clients[np.argsort(-units[clients], kind="stable")]


def _fill_greedily(
    table: NDArray[np.int64],
    rows: NDArray[np.intp],
    seed_levels: NDArray[np.int64],
    clients: NDArray[np.intp],
    units: NDArray[np.int64],
    total: int,
) -> None:
    """Pour the clients' units, in order, into distributions ``rows`` of ``table``.

    The greedy pass shared by Algorithms 1 and 2: client after client, its
    units go into the current distribution until it holds ``total``, the
    excess into the next one.  Laid end to end on one line, the free room of
    the distributions and the clients' units share the same length; the
    boundaries of both cut it into pieces that each lie in one distribution
    and come from one client, found by two sorted searches, without a loop and
    in ``O((m + N) log(m + N))`` time and memory.

    Parameters
    ----------
    table : NDArray[np.int64]
        The ``(m, N)`` unit table, filled in place.
    rows : NDArray[np.intp]
        The distributions to fill, in filling order.
    seed_levels : NDArray[np.int64]
        Units already in each of ``rows`` (all ``<= total``).
    clients : NDArray[np.intp]
        The clients to place, in placement order; none has units in ``rows``.
    units : NDArray[np.int64]
        Units of each of ``clients``; they add up to the free room,
        ``sum(total - seed_levels)``.
    total : int
        Capacity of a distribution (``M_tot``).
    """
    room_end = np.cumsum(total - seed_levels)
    units_end = np.cumsum(units)
    piece_end = np.union1d(room_end, units_end)
    piece_units = np.diff(piece_end, prepend=0)
    # Empty rooms or empty clients only produce zero-length pieces.
    piece_end, piece_units = piece_end[piece_units > 0], piece_units[piece_units > 0]
    # A piece (start, end] lies in the first room, and comes from the first
    # client, whose segment ends at or after `end`.
    distribution = np.searchsorted(room_end, piece_end)
    client = np.searchsorted(units_end, piece_end)
    table[rows[distribution], clients[client]] = piece_units


def _cut_by_capacity(
    tree: NDArray[np.float64], units: NDArray[np.int64], total: int
) -> NDArray[np.intp]:
    """Cut a linkage tree into the largest subtrees of at most ``total`` units.

    **Decision:** the paper leaves the cut open ("cut P to determine K >= m
    groups" with ``q_k <= M``).  As the authors' reference code does, every
    merge height is replaced by the units of the merged subtree and the tree
    is cut at height ``total``: a group is a subtree that fits in one
    distribution whose parent does not.  This gives the fewest groups that
    fit, each a whole branch of the tree, in ``O(N)``, and unlike cutting at
    merge heights (``fcluster`` with ``maxclust``) it cannot get stuck on tied
    heights, e.g. the zero distances between never-sampled clients.  Every
    leaf fits (``units < total``), so every client gets a group.

    Returns
    -------
    NDArray[np.intp]
        Group label ``0..K-1`` of each leaf.
    """
    from scipy.cluster.hierarchy import fcluster  # scipy on first use, see top

    leaves = units.size
    subtree_units = np.concatenate([units, np.zeros(leaves - 1, np.int64)])
    for merge, (left, right) in enumerate(tree[:, :2].astype(np.intp)):
        subtree_units[leaves + merge] = subtree_units[left] + subtree_units[right]
    by_units = tree.copy()
    by_units[:, 2] = subtree_units[leaves:]
    return fcluster(by_units, t=total, criterion="distance").astype(np.intp) - 1
