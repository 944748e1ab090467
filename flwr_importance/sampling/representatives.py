"""Representative gradients for clustered sampling, Algorithm 2 (Fraboni et al., 2021).

Algorithm 2 clusters the clients by the distances between their
*representative gradients*: each client's last returned model minus the
global model it started from. :class:`RepresentativeGradients` keeps one row
per client (whole, or as a :class:`~flwr_importance.sampling.scale.sketch.CountSketch`)
and their distance matrix (:mod:`.distances`), recomputing only the rows of
clients with a new update; the clustering that reads the matrix is
:func:`~flwr_importance.sampling.clustered.clustered_distributions_from_distances`,
and the strategy that feeds both is
:class:`~flwr_importance.strategies.clustered.ClusteredSampling`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from flwr_importance.sampling.distances import Distance, cross_distances
from flwr_importance.sampling.scale.sketch import CountSketch

__all__ = [
    "RepresentativeGradients",
]


class RepresentativeGradients:
    """Each node's representative gradient and the distances between them.

    Rows follow the node ids given to :meth:`align` (a new node starts at
    zero, a departed one is dropped); :meth:`update` overwrites the rows of
    nodes with a new update; :meth:`distances` recomputes only the rows and
    columns of the nodes whose gradient changed (or that are new).

    Parameters
    ----------
    distance : {"arccos", "l2", "l1"}
        The dissimilarity.
    projection_dim : int or None
        Dimension of the CountSketch applied to every update, or None to keep
        updates whole (float32).
    seed : int
        Seed of the sketch.  The sketch is drawn once per update dimension
        ``d`` and kept, so rows stored in different rounds stay comparable.
    matrix_limit : int or None
        Keep the ``(N, N)`` distance matrix only while there are at most this
        many nodes (None: always).  Above it, :meth:`distances` refuses and
        no ``N x N`` array is allocated: Algorithm 2 clusters the rows
        themselves (:meth:`rows`, docs/methods.md §4); when the nodes fall
        back within the limit, the whole matrix is recomputed.

    Examples
    --------
    Three nodes, two with an update: the arccos distance of orthogonal
    gradients is ``pi/2``, and a node without one (a zero gradient) is at
    ``pi/2`` from every other.

    >>> gradients = RepresentativeGradients("arccos", None, seed=0)
    >>> gradients.align([7, 8, 9])
    >>> gradients.update({7: np.array([1.0, 0.0]), 8: np.array([0.0, 2.0])})
    >>> (gradients.distances() / (np.pi / 2)).round(6).tolist()
    [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
    """

    def __init__(
        self,
        distance: Distance,
        projection_dim: int | None,
        seed: int,
        matrix_limit: int | None = None,
    ) -> None:
        self.distance = distance
        self.projection_dim = projection_dim
        self.seed = seed
        self.matrix_limit = matrix_limit
        self.node_ids: list[int] = []
        self._row_of: dict[int, int] = {}
        self._rows = np.zeros((0, 0), np.float32)
        self._distances = np.zeros((0, 0))
        self._stale: set[int] = set()
        self._sketch: CountSketch | None = None

    @property
    def nbytes(self) -> int:
        """Bytes held by the gradients, the distance matrix and the sketch."""
        sketch_bytes = 0 if self._sketch is None else self._sketch.nbytes
        return self._rows.nbytes + self._distances.nbytes + sketch_bytes

    @property
    def keeps_matrix(self) -> bool:
        """Whether the distance matrix is kept (at most ``matrix_limit`` nodes)."""
        return self.matrix_limit is None or len(self.node_ids) <= self.matrix_limit

    def rows(self) -> NDArray[np.float32]:
        """The ``(N, width)`` representative gradients, row ``i`` node ``i``'s.

        The stored array itself (no copy; do not modify it); one zero column
        before the first update, when every gradient is zero.
        """
        if self._rows.shape[1] == 0:
            return np.zeros((len(self.node_ids), 1), np.float32)
        return self._rows

    def take_changed_rows(self) -> NDArray[np.intp]:
        """Rows whose gradient changed since the last call, then forget them.

        Every row after the nodes changed (:meth:`align`) or when the
        distance matrix is kept (it consumes the same record: call one or
        the other).  For the two-level clustering, which keeps its own state
        between rounds
        (:class:`~flwr_importance.sampling.scale.incremental.IncrementalTwoLevel`).
        """
        changed = np.array(
            sorted(self._row_of[node_id] for node_id in self._stale), np.intp
        )
        self._stale = set()
        return changed

    def gradient(self, node_id: int) -> NDArray[np.float32]:
        """The node's representative gradient (zeros if it never returned a model)."""
        return self._rows[self._row_of[node_id]].copy()

    def align(self, node_ids: Sequence[int]) -> None:
        """Keep the rows of ``node_ids``, in that order; new nodes start at zero.

        **Decision:** nothing moves when the nodes are last round's (the usual
        round); otherwise the kept rows and columns are gathered with
        ``take``, row copies then one gather per row: 0.5 s at 10,000 nodes,
        where scattering them into a zero matrix with ``np.ix_`` took 1 to
        3 s.
        """
        if list(node_ids) == self.node_ids:
            return
        had_matrix = self.keeps_matrix
        old_row = {node_id: row for row, node_id in enumerate(self.node_ids)}
        is_new = np.array([node_id not in old_row for node_id in node_ids], bool)
        keeps_matrix = self.matrix_limit is None or len(node_ids) <= self.matrix_limit
        # Above the limit the matrix is empty: no N x N array is allocated.
        size = len(node_ids) if keeps_matrix else 0
        distances = np.zeros((0, 0))
        if is_new.all():
            rows = np.zeros((len(node_ids), self._rows.shape[1]), np.float32)
            distances = np.zeros((size, size))
        else:
            # A new node copies old row 0 for now and is zeroed just below.
            source = np.array([old_row.get(node_id, 0) for node_id in node_ids])
            rows = self._rows.take(source, axis=0)
            rows[is_new] = 0.0
            if keeps_matrix and had_matrix:
                distances = self._distances.take(source, axis=0).take(source, axis=1)
                distances[is_new, :] = 0.0
                distances[:, is_new] = 0.0
        if not (keeps_matrix and had_matrix):
            # No matrix above the limit; back within it, every row is stale.
            if distances.shape != (size, size):
                distances = np.zeros((size, size))
            self._stale = set(node_ids)
            self._set_nodes(node_ids, rows, distances)
            return
        # New nodes (zero gradients) still need their distances computed.
        new_nodes = {node_id for node_id in node_ids if node_id not in old_row}
        self._stale = (self._stale & set(node_ids)) | new_nodes
        self._set_nodes(node_ids, rows, distances)

    def _set_nodes(
        self,
        node_ids: Sequence[int],
        rows: NDArray[np.float32],
        distances: NDArray[np.float64],
    ) -> None:
        """Adopt ``node_ids`` with their gathered rows and distances."""
        self.node_ids = list(node_ids)
        self._row_of = {node_id: row for row, node_id in enumerate(self.node_ids)}
        self._rows, self._distances = rows, distances

    def update_from_models(
        self,
        models: Mapping[int, Sequence[NDArray[np.floating]]],
        start: Sequence[NDArray[np.floating]],
    ) -> None:
        """Store each node's model minus ``start``, both given as their arrays.

        With a projection, each difference is sketched array by array
        (:meth:`CountSketch.apply_difference`, the same sketch as of the
        concatenated difference): no model-sized concatenation per update.
        Without one, as :meth:`update` of the concatenated difference.
        """
        if self.projection_dim is None:
            start_vector = np.concatenate([np.ravel(part) for part in start])
            difference = np.empty_like(start_vector)
            for node_id, parts in models.items():
                model = np.concatenate([np.ravel(part) for part in parts])
                np.subtract(model, start_vector, out=difference)
                self.update({node_id: difference})
            return
        sketch = self._sketch_of(sum(np.size(part) for part in start))
        for node_id, parts in models.items():
            row = self._row_of.get(node_id)
            if row is None:
                continue
            self._ensure_width(self.projection_dim)
            sketch.apply_difference(parts, start, out=self._rows[row])
            self._stale.add(node_id)

    def _ensure_width(self, width: int) -> None:
        """Rows of ``width`` columns: the first update sets it, every row zero."""
        if self._rows.shape[1] != width:
            self._rows = np.zeros((len(self.node_ids), width), np.float32)

    def _sketch_of(self, input_dim: int) -> CountSketch:
        """The sketch for updates of ``input_dim`` entries, drawn once per dimension.

        Drawn once per update dimension, not per round: drawing costs as much
        as sketching a few updates.
        """
        if self._sketch is None or self._sketch.input_dim != input_dim:
            assert self.projection_dim is not None
            self._sketch = CountSketch(
                input_dim, self.projection_dim, np.random.default_rng(self.seed)
            )
        return self._sketch

    def update(self, updates: Mapping[int, NDArray[np.floating]]) -> None:
        """Store new updates (projected if configured) for known nodes.

        Each update is copied or sketched into its node's row at once, so the
        caller may reuse one array for all of them.
        """
        for node_id, update in updates.items():
            row = self._row_of.get(node_id)
            if row is None:
                continue
            width = update.size if self.projection_dim is None else self.projection_dim
            self._ensure_width(width)
            if self.projection_dim is None:
                self._rows[row] = update
            else:
                self._sketch_of(update.size).apply(update, out=self._rows[row])
            self._stale.add(node_id)

    def distances(self) -> NDArray[np.float64]:
        """The ``(N, N)`` distance matrix, rows of changed nodes recomputed.

        **Decision:** the stale rows that are zero (new nodes, which have
        returned no update yet) are not computed one by one: a zero gradient
        has the same distances to every gradient, whichever client holds it,
        so they are computed once, in ``O(N d)``, and copied.  On the first
        round with updates every node is new, and only the ``m`` updated rows
        of the ``N`` stale ones are turned into distances (all ``N`` took
        25 s at 10,000 nodes).

        Raises
        ------
        ValueError
            Above ``matrix_limit`` nodes, where no matrix is kept.
        """
        if not self.keeps_matrix:
            raise ValueError(
                f"no distance matrix above {self.matrix_limit} nodes "
                f"({len(self.node_ids)} now): cluster rows() instead"
            )
        if self._rows.shape[1] == 0:
            # No update yet: every gradient is zero, every distance 0.
            return self._distances
        stale = np.array(
            sorted(self._row_of[node_id] for node_id in self._stale), np.intp
        )
        is_zero = ~np.any(self._rows[stale], axis=1)
        self._fill_zero_gradient_rows(stale[is_zero])
        self._recompute_rows(stale, np.flatnonzero(~is_zero))
        self._stale = set()
        return self._distances

    def _fill_zero_gradient_rows(self, rows: NDArray[np.intp]) -> None:
        """Set the distances of the zero gradients ``rows`` from one zero gradient.

        A zero gradient's distance to another gradient depends on that one
        only (``pi/2``, its norm or its L1 norm, and 0 to another zero
        gradient), so the rows come out as recomputing them would give them.
        """
        if rows.size == 0:
            return
        zero = np.zeros((1, self._rows.shape[1]), np.float32)
        from_zero = cross_distances(zero, self._rows, self.distance)[0]
        self._distances[rows, :] = from_zero
        # The zero rows' own columns already hold 0 from the line above.
        others = np.ones(len(self.node_ids), bool)
        others[rows] = False
        self._distances[np.ix_(others, rows)] = from_zero[others, None]

    def _recompute_rows(
        self, stale: NDArray[np.intp], recomputed: NDArray[np.intp]
    ) -> None:
        """Recompute the rows and columns ``stale[recomputed]`` from the gradients.

        ``O(k N d)`` for ``k`` stale rows: the inner products cover every
        stale row, zero ones included (see ``rows`` in
        :func:`~flwr_importance.sampling.distances.cross_distances`), since
        BLAS could round a product of another shape differently and a seeded
        run would then draw other clients.
        """
        if recomputed.size == 0:
            return
        block = cross_distances(
            self._rows[stale], self._rows, self.distance, rows=recomputed
        )
        rows = stale[recomputed]
        self._distances[rows, :] = block
        self._distances[:, rows] = block.T
        # Symmetric to the last bit where two recomputed rows meet, as the
        # clustering's symmetry check requires.
        square = self._distances[np.ix_(rows, rows)]
        self._distances[np.ix_(rows, rows)] = (square + square.T) / 2
        self._distances[rows, rows] = 0.0
