"""Two-level clustering for Algorithm 2 of clustered sampling at scale.

Exact Ward clustering needs every pairwise distance: ``N^2`` memory and at
least ``N^2`` time (800 MB of float64 at 10,000 clients).  Above a stated number
of clients (``exact_ward_limit`` in
:func:`~flwr_importance.sampling.clustered.clustered_distributions_by_similarity`)
Algorithm 2 clusters in two levels instead, never forming an ``N x N`` array
(docs/methods.md §4):

1. the representative gradients are mapped to points whose Euclidean geometry
   is the distance's (:func:`clustering_points`);
2. *level 1*: the clients with a zero gradient form one group (they are at
   distance 0 from each other, as in the exact path); the others are split
   into about ``max(sqrt(n), m)`` groups by k-means (k-means++ seeding and
   Lloyd's iterations, on a seeded Gaussian projection to ``KMEANS_DIM``
   dimensions only for wider points, over a uniform subsample of
   ``KMEANS_SAMPLE_PER_GROUP`` clients per group, then every client to its
   nearest centre: ``O(n d)`` in all);
3. a group holding more than one distribution's units is split into blocks
   that fit (:func:`capacity_blocks`), so that the capacity cut of Algorithm 2
   can still separate it;
4. *level 2*: Ward hierarchical clustering of the blocks' centroids, each
   weighted by its number of clients (:func:`weighted_ward_linkage`): Ward's
   criterion on the clients themselves, with every block taken as already
   merged.

The tree over the blocks then goes through the same capacity cut and the same
filling as the exact path, so the distributions keep every property of
Algorithm 2.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.sampling.distances import Distance, _checked_squared_norms
from flwr_importance.validation import float_matrix, nonnegative_vector

__all__ = [
    "KMEANS_DIM",
    "KMEANS_ITERATIONS",
    "KMEANS_SAMPLE_PER_GROUP",
    "block_tree",
    "capacity_blocks",
    "clustering_points",
    "kmeans",
    "two_level_tree",
    "weighted_ward_linkage",
]

#: Points with more dimensions are projected (seeded Gaussian) to this many
#: for the k-means of level 1.  A 64-dimensional projection of
#: 1,024-dimensional sketches lost much of exact Ward's class coverage on a
#: noisy mixture where no projection kept it (docs/methods.md §4), so sketched
#: gradients (``projection_dim`` 1,024) are not projected.
KMEANS_DIM = 2048
#: Lloyd iterations of the k-means of level 1.
KMEANS_ITERATIONS = 10
#: The Lloyd iterations run on a uniform subsample of this many clients per
#: group (all clients are then assigned to the nearest centre once).
KMEANS_SAMPLE_PER_GROUP = 32


def clustering_points(
    representative_grads: ArrayLike, distance: Distance = "arccos"
) -> NDArray[np.float32]:
    """Points whose Euclidean distances stand for the gradients' ``distance``.

    - ``arccos``: each non-zero gradient divided by its norm, plus a last
      coordinate 0; a zero gradient becomes the unit vector of that last
      coordinate.  Euclidean (chord) distance ``2 sin(theta / 2)`` is an
      increasing function of the angle ``theta`` (equal to it up to
      ``theta^3 / 24``), and a zero gradient is at the chord of ``pi/2`` from
      every non-zero one and at 0 from another zero one, as in
      :func:`~flwr_importance.sampling.distances.pairwise_distances`.
    - ``l2``: the gradients themselves.
    - ``l1``: the gradients themselves as well.  k-means and Ward minimise
      sums of squares, a Euclidean criterion with no L1 counterpart (the
      exact path applies Ward's update formula to L1 distances); a sketched
      gradient does not keep L1 distances either.

    Parameters
    ----------
    representative_grads : ArrayLike
        Array of shape ``(n, d)``, one gradient per row.
    distance : {"arccos", "l2", "l1"}
        The dissimilarity of Algorithm 2.

    Returns
    -------
    NDArray[np.float32]
        Shape ``(n, d + 1)`` for ``arccos``, ``(n, d)`` otherwise.

    Raises
    ------
    ValueError
        If the gradients are not a finite 2-D array whose squared norms are
        finite.

    Examples
    --------
    >>> clustering_points([[3.0, 4.0], [0.0, 0.0]]).tolist()
    [[0.6000000238418579, 0.800000011920929, 0.0], [0.0, 0.0, 1.0]]
    """
    return _points_and_zeros(representative_grads, distance)[0]


def _points_and_zeros(
    representative_grads: ArrayLike, distance: Distance
) -> tuple[NDArray[np.float32], NDArray[np.bool_]]:
    """:func:`clustering_points`, and which gradients are zero."""
    grads = float_matrix("representative_grads", representative_grads)
    squared_norms = _checked_squared_norms(
        np.einsum("ij,ij->i", grads, grads, dtype=np.float64)
    )
    zero = squared_norms == 0
    if distance != "arccos":
        return grads.astype(np.float32, copy=False), zero
    norms = np.sqrt(squared_norms)
    points = np.empty((grads.shape[0], grads.shape[1] + 1), np.float32)
    np.divide(grads, np.where(zero, 1.0, norms)[:, None], out=points[:, :-1])
    points[:, -1] = zero
    return points, zero


def capacity_blocks(
    groups: ArrayLike, units: ArrayLike, total: int
) -> NDArray[np.intp]:
    """Split every group holding more than ``total`` units into blocks that fit.

    In a group above ``total``, a client with at least ``total / 2`` units is
    a block of its own; the others, in index order, are cut where their
    running sum of units crosses a multiple of ``total / 2``, so that no
    block exceeds ``total`` (each holds less than ``total / 2`` of starts plus
    a client below ``total / 2``).  A group within ``total`` stays one block.

    Parameters
    ----------
    groups : ArrayLike
        Group label of each client (non-negative integers).
    units : ArrayLike
        Units of each client, each below ``total``.
    total : int
        Capacity of a block (``M_tot``).

    Returns
    -------
    NDArray[np.intp]
        Block label ``0..B-1`` of each client; a block lies in one group.

    Examples
    --------
    Group 0 holds 8 units, capacity 4: clients 0 and 4 (at least 2 units)
    stand alone, clients 1-3 are cut every 2 units of running sum; group 1
    fits and stays whole.

    >>> capacity_blocks([0, 0, 0, 0, 0, 1], [3, 1, 1, 1, 2, 2], 4).tolist()
    [1, 2, 2, 3, 0, 4]
    """
    labels = np.asarray(groups, np.intp)
    amounts = nonnegative_vector("units", units).astype(np.int64)
    group_units = np.bincount(labels, weights=amounts)
    oversized = group_units[labels] > total
    alone = oversized & (2 * amounts >= total)
    pooled = oversized & ~alone
    # Running sum of the pooled clients' units within their group, excluding
    # their own: where each one starts.
    order = np.lexsort((np.arange(labels.size), labels))
    pooled_units = np.where(pooled, amounts, 0)[order]
    ends = np.cumsum(pooled_units)
    first = np.r_[True, labels[order][1:] != labels[order][:-1]]
    group_start = np.maximum.accumulate(np.where(first, ends - pooled_units, 0))
    starts = np.empty_like(ends)
    starts[order] = ends - pooled_units - group_start
    piece = np.where(pooled, 2 * starts // total, -1)
    piece = np.where(alone, -2 - np.arange(labels.size), piece)
    # Blocks numbered in (group, piece) order: one integer key per pair,
    # sorted as the pairs are (``np.unique`` on rows, as records, is slower).
    span = int(piece.max() - piece.min()) + 1
    keys = labels.astype(np.int64) * span + (piece - piece.min())
    return np.unique(keys, return_inverse=True)[1].reshape(-1).astype(np.intp)


def weighted_ward_linkage(points: ArrayLike, weights: ArrayLike) -> NDArray[np.float64]:
    """Ward hierarchical clustering of weighted points, in scipy's linkage format.

    Point ``i`` stands for ``weights[i]`` clients already merged at
    ``points[i]`` (their centroid): the Ward distance of two clusters is
    ``sqrt(2 w_a w_b / (w_a + w_b)) ||c_a - c_b||``, updated by the
    Lance-Williams formula, which with unit weights is
    ``scipy.cluster.hierarchy.linkage(points, "ward")``.  Built by the
    nearest-neighbour chain (Ward's criterion is reducible), ``O(k^2)`` time
    and memory for ``k`` points; rows are in merge order, not sorted by height.

    Parameters
    ----------
    points : ArrayLike
        Array of shape ``(k, d)``, ``k >= 1``.
    weights : ArrayLike
        Positive weight of each point.

    Returns
    -------
    NDArray[np.float64]
        Array of shape ``(k - 1, 4)``: the two merged cluster ids, the Ward
        distance, the number of points below (ids ``k + j`` for row ``j``).

    Raises
    ------
    ValueError
        If the points are not a finite 2-D array or the weights are not
        positive.

    Examples
    --------
    With unit weights it is scipy's Ward linkage:

    >>> from scipy.cluster.hierarchy import linkage
    >>> points = [[0.0, 0.0], [0.0, 1.0], [4.0, 0.0], [4.0, 2.0]]
    >>> tree = weighted_ward_linkage(points, [1, 1, 1, 1])
    >>> sorted(tree[:, 2].round(4).tolist())
    [1.0, 2.0, 5.7009]
    >>> sorted(linkage(points, "ward")[:, 2].round(4).tolist())
    [1.0, 2.0, 5.7009]
    """
    mass = nonnegative_vector("weights", weights)
    return _ward_tree(_squared_distances(float_matrix("points", points)), mass)


def _squared_distances(points: NDArray[np.floating]) -> NDArray[np.float64]:
    """Squared Euclidean distances between the rows of ``points``, in float64."""
    centres = points.astype(np.float64)
    squared = np.einsum("ij,ij->i", centres, centres)
    distances = np.add.outer(squared, squared) - 2 * (centres @ centres.T)
    return np.maximum(distances, 0.0, out=distances)


def _ward_tree(
    squared_distances: NDArray[np.float64], weights: NDArray[np.float64]
) -> NDArray[np.float64]:
    """:func:`weighted_ward_linkage` from the points' squared distances."""
    mass = weights.astype(np.float64)
    k = mass.size
    if squared_distances.shape != (k, k) or np.any(mass <= 0):
        raise ValueError("weights must be positive, one per point")
    ward = squared_distances * (2 * np.outer(mass, mass) / np.add.outer(mass, mass))
    np.fill_diagonal(ward, np.inf)
    label = list(range(k))
    count = [1] * k
    gone = np.zeros(k, bool)
    tree = np.empty((max(k - 1, 0), 4))
    chain: list[int] = []
    merged = np.empty(k)
    term = np.empty(k)
    for merge in range(k - 1):
        while True:
            if not chain:
                chain.append(int(np.argmin(gone)))
            a = chain[-1]
            b = int(np.argmin(ward[a]))
            # Ties go to the previous link of the chain, so the chain ends.
            if len(chain) > 1 and ward[a, chain[-2]] <= ward[a, b]:
                b = chain[-2]
                break
            chain.append(b)
        del chain[-2:]
        mass_a, mass_b, joined = float(mass[a]), float(mass[b]), float(ward[a, b])
        tree[merge] = (label[a], label[b], math.sqrt(joined), count[a] + count[b])
        # Lance-Williams: ((m_a + m) w_a + (m_b + m) w_b - m w_ab) / (m_a + m_b + m).
        # Rows of merged clusters and the diagonal hold inf, which carries
        # through: a, b and the clusters gone stay at inf.
        np.multiply(np.add(mass, mass_a, out=term), ward[a], out=merged)
        merged += np.multiply(np.add(mass, mass_b, out=term), ward[b], out=term)
        merged -= np.multiply(mass, joined, out=term)
        merged /= np.add(mass, mass_a + mass_b, out=term)
        gone[b] = True
        ward[a, :] = merged
        ward[:, a] = merged
        ward[b, :] = np.inf
        ward[:, b] = np.inf
        mass[a] = mass_a + mass_b
        count[a] += count[b]
        label[a] = k + merge
    return tree


def two_level_tree(
    representative_grads: ArrayLike,
    units: ArrayLike,
    total: int,
    distance: Distance = "arccos",
    *,
    groups: int,
    seed: int = 0,
) -> tuple[NDArray[np.float64], NDArray[np.intp], NDArray[np.int64]]:
    """Levels 1 and 2 of the scalable Algorithm 2 (see the module docstring).

    Parameters
    ----------
    representative_grads : ArrayLike
        Array of shape ``(n, d)``, the gradients of the clients to cluster.
    units : ArrayLike
        Units of each client, each below ``total``.
    total : int
        Capacity of a distribution (``M_tot``).
    distance : {"arccos", "l2", "l1"}
        The dissimilarity (see :func:`clustering_points`).
    groups : int
        Number of k-means groups of level 1 (at most ``n``).
    seed : int
        Seed of the projection and of the k-means initial centres.

    Returns
    -------
    tuple
        The Ward linkage over the ``B`` blocks, the block of each client and
        the units of each block (each at most ``total``).

    Examples
    --------
    Two directions, two clients each, capacity 2 units: one block per
    direction, merged last.

    >>> grads = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0]]
    >>> tree, block, block_units = two_level_tree(grads, [1, 1, 1, 1], 2, groups=2)
    >>> bool(block[0] == block[2] != block[1] == block[3]), block_units.tolist()
    (True, [2, 2])
    """
    grads = float_matrix("representative_grads", representative_grads)
    amounts = nonnegative_vector("units", units).astype(np.int64)
    rng = np.random.default_rng(seed)
    nonzero = np.flatnonzero(np.any(grads, axis=1))
    # Only the non-zero gradients are mapped: zero ones all sit at one point.
    points = clustering_points(grads[nonzero], distance)
    labels = np.zeros(grads.shape[0], np.intp)
    if nonzero.size:
        labels[nonzero] = 1 + kmeans(points, groups, rng)[0]
    return block_tree(labels, amounts, total, distance, points, np.arange(nonzero.size))


def block_tree(
    labels: NDArray[np.intp],
    amounts: NDArray[np.int64],
    total: int,
    distance: Distance,
    points: NDArray[np.float32],
    point_of: NDArray[np.intp],
) -> tuple[NDArray[np.float64], NDArray[np.intp], NDArray[np.int64]]:
    """Steps 3 and 4 (blocks, Ward on their centroids) from level 1's groups.

    ``labels`` is 0 for a zero gradient and ``1 + group`` otherwise;
    ``points[point_of[j]]`` is the point of the ``j``-th client with a
    non-zero gradient, in index order.  Returns what :func:`two_level_tree`
    returns.
    """
    zero = labels == 0
    nonzero = np.flatnonzero(~zero)
    block = capacity_blocks(labels, amounts, total)
    blocks = int(block.max()) + 1
    members = np.bincount(block, minlength=blocks)
    centroids = np.zeros((blocks, points.shape[1]))
    # A zero gradient's point: the origin, or the last axis for arccos.
    centroids[block[zero], -1] = 1.0 if distance == "arccos" else 0.0
    # A block holds zero gradients only or non-zero ones only (its group's).
    has_nonzero = np.bincount(block[nonzero], minlength=blocks) > 0
    if nonzero.size:
        sums = _group_sums(block[nonzero], blocks, points, point_of)
        centroids[has_nonzero] = sums[has_nonzero]
        centroids[has_nonzero] /= members[has_nonzero, None]
    block_units = np.bincount(block, weights=amounts, minlength=blocks)
    # The blocks of zero gradients share one centroid: distances are taken
    # between distinct centroids only (in early rounds most blocks are zero
    # ones), then spread to every block.
    distinct = np.flatnonzero(has_nonzero)
    row = np.full(blocks, distinct.size)
    row[distinct] = np.arange(distinct.size)
    squared = _squared_distances(
        np.vstack([centroids[distinct], centroids[block[zero][:1]]])
    )
    tree = _ward_tree(squared[np.ix_(row, row)], members.astype(np.float64))
    return tree, block, block_units.astype(np.int64)


def kmeans(
    points: NDArray[np.float32], groups: int, rng: np.random.Generator
) -> tuple[NDArray[np.intp], NDArray[np.float32], NDArray[np.float32] | None]:
    """Lloyd's k-means of ``points`` into at most ``groups`` groups.

    Run on a Gaussian projection to :data:`KMEANS_DIM` dimensions when the
    points have more (Johnson-Lindenstrauss: squared distances kept to a
    relative standard deviation of ``sqrt(2 / KMEANS_DIM)``; the centroids
    of level 2 are in the full space).  Initial
    centres: k-means++ seeding; an empty group keeps its centre; the
    iterations stop early once the labels repeat (the result is the same).

    Returns
    -------
    tuple
        The group ``0..K-1`` of each point, the ``K`` centres of the groups
        used (in the projected space) and the projection matrix (None: no
        projection).
    """
    n = points.shape[0]
    if n <= groups:
        return np.arange(n, dtype=np.intp), points.copy(), None
    projection = None
    if points.shape[1] > KMEANS_DIM:
        projection = (
            rng.standard_normal((points.shape[1], KMEANS_DIM)) / math.sqrt(KMEANS_DIM)
        ).astype(np.float32)
        points = points @ projection
    sample = points[
        np.sort(rng.choice(n, min(n, KMEANS_SAMPLE_PER_GROUP * groups), replace=False))
    ]
    centres = _kmeans_plus_plus(sample, groups, rng)
    previous = None
    for _ in range(KMEANS_ITERATIONS):
        labels = _nearest(sample, centres)
        # Labels as last time: the centres would come out the same, and so
        # would every later iteration.
        if previous is not None and np.array_equal(labels, previous):
            break
        previous = labels
        counts = np.bincount(labels, minlength=groups)
        filled = counts > 0
        sums = _group_sums(labels, groups, sample)
        centres[filled] = sums[filled] / counts[filled, None]
    used, labels = np.unique(_nearest(points, centres), return_inverse=True)
    return labels.reshape(-1).astype(np.intp), centres[used], projection


def _kmeans_plus_plus(
    points: NDArray[np.float32], groups: int, rng: np.random.Generator
) -> NDArray[np.float32]:
    """k-means++ seeding (Arthur and Vassilvitskii, 2007): ``groups`` centres.

    Each next centre is a point drawn with probability proportional to its
    squared distance to the nearest centre so far, so well-separated clusters
    each get a centre (uniform seeding leaves some without one, and Lloyd's
    iterations then merge them with a neighbour).  Points that coincide with
    the centres (squared distance below ``1e-5`` of the squared norms, the
    float32 rounding of the distance's product) have probability 0; once
    all do, the rest are drawn uniformly.
    """
    squared = np.einsum("ij,ij->i", points, points).astype(np.float64)

    def squared_distances_to(index: int) -> NDArray[np.float64]:
        # ||p||^2 + ||c||^2 - 2 <p, c>: one float32 matrix-vector product per
        # centre, no n x d difference.  Its rounding leaves about 1e-6 of the
        # norms of a point's distance to itself: below 1e-5 of them, a
        # distance counts as zero.
        scale = squared + squared[index]
        distances = scale - 2 * (points @ points[index]).astype(np.float64)
        distances[distances <= 1e-5 * scale] = 0.0
        return distances

    chosen = [int(rng.integers(points.shape[0]))]
    nearest = squared_distances_to(chosen[0])
    for _ in range(groups - 1):
        cumulative = np.cumsum(nearest)
        if cumulative[-1] > 0:
            # The first point whose cumulative weight passes the uniform: a
            # point of weight 0 is never drawn.
            target = rng.random() * cumulative[-1]
            index = int(np.searchsorted(cumulative, target, side="right"))
            index = min(index, int(np.flatnonzero(nearest)[-1]))
        else:
            index = int(rng.integers(points.shape[0]))
        chosen.append(index)
        np.minimum(nearest, squared_distances_to(index), out=nearest)
    return points[chosen].copy()


def _nearest(
    points: NDArray[np.float32], centres: NDArray[np.float32]
) -> NDArray[np.intp]:
    """Index of the nearest centre of each point (squared Euclidean)."""
    squared = np.einsum("ij,ij->i", centres, centres)
    return np.argmin(squared - 2 * (points @ centres.T), axis=1)


def _group_sums(
    labels: NDArray[np.intp],
    groups: int,
    points: NDArray[np.float32],
    point_of: NDArray[np.intp] | None = None,
) -> NDArray[np.float32]:
    """Sum of each group's points, ``(groups, d)``: a sparse one-hot product.

    ``labels[j]`` is the group of ``points[point_of[j]]`` (``point_of``
    None: of ``points[j]``), so a subset of the rows is summed without
    gathering it.
    """
    from scipy.sparse import csr_matrix  # scipy on first use, see clustered.py

    rows = np.arange(labels.size) if point_of is None else point_of
    one_hot = csr_matrix(
        (np.ones(labels.size, np.float32), (labels, rows)),
        shape=(groups, points.shape[0]),
    )
    return np.asarray(one_hot @ points, np.float32)
