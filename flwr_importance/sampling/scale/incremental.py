"""Algorithm 2's two-level clustering kept from one round to the next.

From one round to the next only the clients drawn (about ``m``) return a new
representative gradient, yet :func:`~.two_level.two_level_tree` clusters all
``N`` of them from scratch: at 10,000 clients its k-means is most of the
server's round.  :class:`IncrementalTwoLevel` keeps level 1 (the clients'
points, the k-means centres, each client's group and the groups' sums)
between rounds, and each round (docs/methods.md §4):

1. moves only the clients whose gradient changed: out of their old group's
   sum, into that of the centre nearest their new point (``O(m k d)``);
2. runs Lloyd's iterations on *all* clients from the kept centres, each
   centre the mean of its group, and stops once no label changes.  Elkan's
   bounds (Elkan, "Using the triangle inequality to accelerate k-means",
   ICML 2003) leave most clients untouched: an upper bound on the distance
   to the own centre and a lower bound on the distance to each other centre,
   moved by how far the centres moved (``O(N k)`` a step); only a client
   whose bounds cross is measured again, against its own centre, then, if
   they still cross, against every centre.  One lower bound per client
   (Hamerly's) is not enough: one centre of a small group moving far lowers
   every client's, and all ``N`` were measured again at 10,000 clients;
3. rebuilds level 2 (blocks and their Ward tree, ``O(N)`` plus a Ward over
   about ``sqrt(N)`` blocks) from the labels, as the cold path does.

Level 1 is recomputed from scratch (the cold path, identical to
:func:`~.two_level.two_level_tree`) on the first call, when the clustered
clients or the number of groups change, when the changed clients are unknown,
or when more than :data:`REBUILD_FRACTION` of them changed.  A call in which
no client changed returns the previous clustering.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_importance.sampling.clustered import (
    _allocate_by_similarity,
    _checked_units,
    _Tree,
    _two_level_groups,
)
from flwr_importance.sampling.distances import Distance
from flwr_importance.sampling.scale.two_level import (
    block_tree,
    clustering_points,
    kmeans,
)
from flwr_importance.validation import float_matrix, nonnegative_vector

__all__ = [
    "REBUILD_FRACTION",
    "WARM_ITERATIONS",
    "IncrementalTwoLevel",
    "clustered_distributions_incrementally",
]

#: Above this fraction of clients with a new gradient, level 1 is recomputed
#: from scratch: the warm iterations would measure most clients anyway.
REBUILD_FRACTION = 0.5
#: Most Lloyd iterations of a warm round (they usually stop, labels repeated,
#: after one or two).
WARM_ITERATIONS = 10


@dataclass
class _Level1:
    """Level 1 of the last round: what the next round starts from."""

    population: NDArray[np.intp]
    groups: int
    #: The clients' points (level 2's space) and k-means points (projected
    #: when the points are wider than ``KMEANS_DIM``; else the same array).
    points: NDArray[np.float32]
    kmeans_points: NDArray[np.float32]
    projection: NDArray[np.float32] | None
    #: Group of each client, -1 for a zero gradient.
    labels: NDArray[np.intp]
    centres: NDArray[np.float32]
    sums: NDArray[np.float64]
    counts: NDArray[np.int64]
    #: Elkan's bounds: on the distance to the own centre, and ``(n, k)`` on
    #: the distance to each centre (inf at the own one).
    upper: NDArray[np.float64]
    lower: NDArray[np.float32]


class IncrementalTwoLevel:
    """The two-level clustering of Algorithm 2, level 1 kept between rounds.

    See the module docstring.  The clustering is a valid one of the current
    gradients whatever path ran (every client in one group, Algorithm 2's
    invariants hold); what it keeps is the k-means optimum of the previous
    rounds, refined, rather than a fresh seeding.

    Parameters
    ----------
    distance : {"arccos", "l2", "l1"}
        The dissimilarity (see :func:`~.two_level.clustering_points`).
    seed : int
        Seed of the cold path's projection and k-means initial centres.

    Attributes
    ----------
    rebuilds : int
        How many calls took the cold path.

    Examples
    --------
    A client turning to the other direction joins that direction's block.

    >>> grads = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0]])
    >>> clustering = IncrementalTwoLevel("arccos")
    >>> block = clustering.tree(grads, [1] * 4, 3, groups=2, changed=None)[1]
    >>> bool(block[0] == block[2] != block[1] == block[3])
    True
    >>> grads[2] = [0.0, 1.0]
    >>> block = clustering.tree(grads, [1] * 4, 3, groups=2, changed=[2])[1]
    >>> bool(block[1] == block[2] == block[3] != block[0]), clustering.rebuilds
    (True, 1)
    """

    def __init__(self, distance: Distance = "arccos", *, seed: int = 0) -> None:
        self.distance = distance
        self.seed = seed
        self.rebuilds = 0
        self._level1: _Level1 | None = None

    def tree(
        self,
        representative_grads: ArrayLike,
        units: ArrayLike,
        total: int,
        *,
        groups: int,
        changed: ArrayLike | None,
        population: ArrayLike | None = None,
    ) -> tuple[NDArray[np.float64], NDArray[np.intp], NDArray[np.int64]]:
        """:func:`~.two_level.two_level_tree`, level 1 updated from the last call.

        Parameters
        ----------
        representative_grads, units, total, groups
            As in :func:`~.two_level.two_level_tree`.
        changed : ArrayLike or None
            Rows whose gradient changed since the last call; None: unknown
            (level 1 is recomputed).
        population : ArrayLike or None
            Which clients the rows are (e.g. their indices among all
            clients): another population than the last call's recomputes
            level 1.  None: the rows' count alone identifies it.

        Returns
        -------
        tuple
            As :func:`~.two_level.two_level_tree`.
        """
        grads = float_matrix("representative_grads", representative_grads)
        amounts = nonnegative_vector("units", units).astype(np.int64)
        clients = np.arange(grads.shape[0]) if population is None else population
        who = np.asarray(clients, np.intp)
        level1 = self._level1
        moved = None if changed is None else np.unique(np.asarray(changed, np.intp))
        if (
            level1 is None
            or moved is None
            or level1.groups != groups
            or level1.centres.shape[0] == 0
            or level1.points.shape[0] != grads.shape[0]
            or not np.array_equal(level1.population, who)
            or moved.size > REBUILD_FRACTION * grads.shape[0]
        ):
            level1 = self._rebuild(grads, groups, who)
        elif moved.size:
            width = level1.points.shape[1] - (self.distance == "arccos")
            if width != grads.shape[1]:
                level1 = self._rebuild(grads, groups, who)
            else:
                rows = grads[moved]
                points = clustering_points(rows, self.distance)
                _move(level1, moved, points, zero=~np.any(rows, axis=1))
                _lloyd(level1)
        live = level1.labels >= 0
        return block_tree(
            np.where(live, level1.labels + 1, 0),
            amounts,
            total,
            self.distance,
            level1.points,
            np.flatnonzero(live),
        )

    def _rebuild(
        self, grads: NDArray[np.floating], groups: int, population: NDArray[np.intp]
    ) -> _Level1:
        """The cold path: level 1 from scratch, as :func:`two_level_tree` finds it."""
        self.rebuilds += 1
        nonzero = np.flatnonzero(np.any(grads, axis=1))
        points = clustering_points(grads, self.distance)
        if np.shares_memory(points, grads):
            # The caller updates its gradients in place; the old points are
            # needed to take them out of their group's sum.
            points = points.copy()
        labels = np.full(grads.shape[0], -1, np.intp)
        centres = np.zeros((0, points.shape[1]), np.float32)
        projection = None
        if nonzero.size:
            found, centres, projection = kmeans(
                points[nonzero], groups, np.random.default_rng(self.seed)
            )
            labels[nonzero] = found
        kmeans_points = points if projection is None else points @ projection
        level1 = _Level1(
            population=population.copy(),
            groups=groups,
            points=points,
            kmeans_points=kmeans_points,
            projection=projection,
            labels=labels,
            centres=centres,
            sums=np.zeros((centres.shape[0], centres.shape[1])),
            counts=np.zeros(centres.shape[0], np.int64),
            upper=np.zeros(labels.size),
            lower=np.full((labels.size, centres.shape[0]), np.inf, np.float32),
        )
        _add(level1, nonzero, labels[nonzero], sign=1)
        _measure(level1, nonzero)
        self._level1 = level1
        return level1


def _add(
    level1: _Level1, rows: NDArray[np.intp], labels: NDArray[np.intp], *, sign: int
) -> None:
    """Add (``sign`` 1) or take out (-1) clients ``rows`` of groups ``labels``."""
    np.add.at(level1.sums, labels, sign * level1.kmeans_points[rows].astype(np.float64))
    np.add.at(level1.counts, labels, sign)


def _move(
    level1: _Level1,
    rows: NDArray[np.intp],
    points: NDArray[np.float32],
    *,
    zero: NDArray[np.bool_],
) -> None:
    """Give clients ``rows`` their new ``points``, each in its nearest group.

    ``zero`` marks the new gradients that are zero: they leave level 1.
    """
    old = level1.labels[rows]
    _add(level1, rows[old >= 0], old[old >= 0], sign=-1)
    level1.points[rows] = points
    if level1.projection is not None:
        level1.kmeans_points[rows] = points @ level1.projection
    level1.labels[rows[zero]] = -1
    live = rows[~zero]
    _measure(level1, live)
    _add(level1, live, level1.labels[live], sign=1)


def _lloyd(level1: _Level1) -> None:
    """Lloyd's iterations over every client from the kept centres (Elkan)."""
    live = level1.labels >= 0
    for _ in range(WARM_ITERATIONS):
        filled = level1.counts > 0
        centres = level1.centres.copy()
        centres[filled] = level1.sums[filled] / level1.counts[filled, None]
        step = centres - level1.centres
        shift = np.sqrt(np.einsum("ij,ij->i", step, step))
        level1.centres = centres
        level1.upper[live] += shift[level1.labels[live]]
        level1.lower -= shift
        suspects = np.flatnonzero(live & (level1.lower.min(axis=1) < level1.upper))
        if suspects.size == 0:
            return
        # The own centre first (``O(d)`` a client): most bounds then hold.
        own = level1.kmeans_points[suspects] - centres[level1.labels[suspects]]
        level1.upper[suspects] = np.sqrt(np.einsum("ij,ij->i", own, own))
        suspects = suspects[level1.lower[suspects].min(axis=1) < level1.upper[suspects]]
        before = level1.labels[suspects]
        _measure(level1, suspects)
        moved = level1.labels[suspects] != before
        if not np.any(moved):
            # Labels as last time: the centres are their groups' means.
            return
        rows = suspects[moved]
        _add(level1, rows, before[moved], sign=-1)
        _add(level1, rows, level1.labels[rows], sign=1)


def _measure(level1: _Level1, rows: NDArray[np.intp]) -> None:
    """Label clients ``rows`` by their nearest centre; their bounds exact.

    The distances come from ``||p||^2 + ||c||^2 - 2 <p, c>`` in float32 (one
    matrix product): a client within its rounding (about ``1e-6`` of the
    squared norms) of two centres may keep the farther one, a tie either
    way; the float32 lower bounds round as finely.
    """
    if rows.size == 0:
        return
    points, centres = level1.kmeans_points[rows], level1.centres
    squared = (
        np.einsum("ij,ij->i", points, points)[:, None]
        + np.einsum("ij,ij->i", centres, centres)[None, :]
        - 2 * (points @ centres.T)
    )
    distances = np.sqrt(np.maximum(squared, 0.0, out=squared), out=squared)
    labels = np.argmin(distances, axis=1)
    nearest = np.arange(rows.size), labels
    level1.labels[rows] = labels
    level1.upper[rows] = distances[nearest]
    distances[nearest] = np.inf
    level1.lower[rows] = distances


def clustered_distributions_incrementally(
    sizes: ArrayLike,
    representative_grads: ArrayLike,
    m: int,
    clustering: IncrementalTwoLevel,
    *,
    changed: ArrayLike | None,
) -> NDArray[np.float64]:
    """Algorithm 2 by the two-level clustering, its level 1 kept between rounds.

    :func:`~..clustered.clustered_distributions_by_similarity` above its
    exact-Ward limit, with the k-means of level 1 updated in ``clustering``
    from the last call
    instead of recomputed (:class:`IncrementalTwoLevel`, with its distance
    and seed): a strategy keeps ``clustering`` and passes the
    rows whose gradient changed since its last call.

    Parameters
    ----------
    sizes, representative_grads, m
        As in :func:`~..clustered.clustered_distributions_by_similarity`.
    clustering : IncrementalTwoLevel
        The level 1 of the previous calls, updated in place.
    changed : ArrayLike or None
        Rows of ``representative_grads`` changed since the last call with
        ``clustering``; None: unknown (level 1 is recomputed).

    Returns
    -------
    NDArray[np.float64]
        A distribution matrix with the exact properties of
        :func:`~..clustered.clustered_distributions_by_similarity`'s.

    Examples
    --------
    >>> grads = [[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0]]
    >>> clustering = IncrementalTwoLevel()
    >>> clustered_distributions_incrementally(
    ...     [1, 1, 1, 1], grads, 2, clustering, changed=None
    ... ).tolist()
    [[0.0, 0.5, 0.0, 0.5], [0.5, 0.0, 0.5, 0.0]]
    """
    units, total, m = _checked_units(sizes, m)
    grads = float_matrix("representative_grads", representative_grads, units.size)
    rows_changed = None if changed is None else np.asarray(changed, np.intp)

    def tree(
        rows: NDArray[np.floating],
        active: NDArray[np.intp],
        units: NDArray[np.int64],
        total: int,
        level1: int,
    ) -> _Tree:
        moved = None
        if rows_changed is not None:
            # Changed rows among the active clients, as positions in ``rows``.
            kept = np.isin(rows_changed, active)
            moved = np.searchsorted(active, rows_changed[kept])
        return clustering.tree(
            rows, units, total, groups=level1, changed=moved, population=active
        )

    return _allocate_by_similarity(units, total, m, _two_level_groups(grads, m, tree))
