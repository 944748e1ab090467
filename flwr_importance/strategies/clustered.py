"""Clustered sampling by sample size or by model similarity (Fraboni et al., 2021)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import INFO
from typing import TYPE_CHECKING, Literal

import numpy as np
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.method_spec import MethodSpec
from flwr_importance.sampling import (
    CountSketch,
    Distance,
    clustered_distributions_by_size,
    clustered_distributions_from_distances,
    cross_distances,
    sample_from_distributions,
)
from flwr_importance.strategies._multiset import DrawRound, MultisetSampling
from flwr_importance.strategies.checks import check_choice, check_count

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from flwr_importance.strategies.base import StrategyOptions

ClusteringMethod = Literal["size", "similarity"]
_SizeKey = tuple[tuple[int, ...], tuple[int, ...], int]


class ClusteredSampling(MultisetSampling):
    """Clustered client sampling (Algorithm 1 or 2) with FedAvg aggregation.

    Implementation based on https://arxiv.org/abs/2105.05883

    Each round, ``m`` distributions ``W_1..W_m`` over the clients (each client
    keeping its MD share, ``sum_k r_{k,i} = m n_i / M_tot``, Proposition 1)
    give one draw each; the new model is the plain mean of the ``m`` drawn
    models, a client drawn twice counting twice (it trains once). Unbiased
    like :class:`~flwr_importance.strategies.md.MDSampling`, with aggregation
    weights of lower variance (eq. 17) and better coverage of different
    clients.

    - ``method="size"`` (Algorithm 1): distributions filled by decreasing
      sample size.
    - ``method="similarity"`` (Algorithm 2): Ward clustering of the distances
      between the clients' *representative gradients* (last returned model
      minus the global model it started from), recomputed every round.  The
      gradients are computed on the server from the returned models: no
      extra client work.

    See docs/methods.md, section "4. Clustered sampling (and MD sampling)",
    for the equations and the decisions.

    Parameters
    ----------
    clients_per_round : int
        ``m``, draws (distributions) per round; capped at the number of
        clients with a known size.
    method : {"size", "similarity"} (default: "similarity")
        Algorithm 1 or Algorithm 2.
    distance : {"arccos", "l2", "l1"} (default: "arccos")
        Dissimilarity between representative gradients (Algorithm 2).
    projection_dim : int or None (default: None)
        Keep each representative gradient as a CountSketch to this many
        dimensions (a sparse random projection, see
        :class:`~flwr_importance.sampling.sketch.CountSketch`) instead of
        the full float32 update: ``N * projection_dim`` floats instead of
        ``N * d``.  The sketch is drawn once from ``seed`` and applies to every
        client and round, in ``O(d)`` time per update.  Expected distortion:
        inner products and squared L2 distances are unbiased with relative
        standard deviation at most ``sqrt(2 / projection_dim)`` (4.4% at
        1024), cosines move by about ``1 / sqrt(projection_dim)``; L1
        distances are *not* preserved (a projection keeps L2 geometry), so
        prefer ``arccos`` or ``l2`` with a projection.  ``None``: no projection.

    Other Parameters
    ----------------
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with its
        defaults (``seed`` seeds the draws and the sketch, ``query_timeout``
        bounds the wait for the replies to ``query.sizes``).

    Client contract
    ---------------
    The same as :class:`~flwr_importance.strategies.md.MDSampling`'s:
    ``query.sizes`` replied with a MetricRecord holding ``num-examples``;
    ``train`` replied with one ArrayRecord shaped like the global model and a
    MetricRecord with ``num-examples``; ``evaluate`` as in ``FedAvg``.

    Handlers: :func:`~flwr_importance.clientapps.sizes.add_size_query` beside
    the user's own train and evaluate functions, or the ready-made
    :func:`~flwr_importance.clientapps.clustered.make_clustered_handlers`.

    Notes
    -----
    Round metrics: ``distinct-clients`` and ``aggregated-draws``.

    What the server learns: each client's sample count and, as in FedAvg, its
    returned model (Algorithm 2 keeps the last update per client).

    Memory (Algorithm 2): one float32 row per client (``d`` or
    ``projection_dim`` entries) and the ``N x N`` float64 distance matrix,
    of which only the rows of clients with a new update are recomputed each
    round; with a projection, also the sketch's ``d`` int64 codes.  1,000
    clients of a 1M-parameter model: 4 GB of float32 rows without
    projection, 4 MB with ``projection_dim=1024`` (+ 8 MB distances, + 8 MB
    codes).  The updates are projected one at a time, through one
    ``d``-sized buffer.
    """

    fewer_nodes_effect = (
        "m is capped at the number of nodes: nearly every node is drawn"
    )

    def __init__(
        self,
        *,
        clients_per_round: int,
        method: ClusteringMethod = "similarity",
        distance: Distance = "arccos",
        projection_dim: int | None = None,
        **options: Unpack[StrategyOptions],
    ) -> None:
        check_choice("method", method, ClusteringMethod)
        check_choice("distance", distance, Distance)
        if projection_dim is not None:
            check_count("projection_dim", projection_dim)
        super().__init__(clients_per_round=clients_per_round, **options)
        self.method = method
        self.distance = distance
        self.projection_dim = projection_dim
        self.gradients = RepresentativeGradients(distance, projection_dim, self.seed)
        # Algorithm 1's distributions and the (nodes, sizes, m) they were built for.
        self._size_distributions: tuple[_SizeKey, NDArray[np.float64]] | None = None

    def sampling_settings(self) -> dict[str, object]:
        """The draws per round and the clustering parameters."""
        if self.method == "size":
            return {**super().sampling_settings(), "Method": "size (Algorithm 1)"}
        return {
            **super().sampling_settings(),
            "Method": "similarity (Algorithm 2)",
            "Distance": self.distance,
            "Projection dim": self.projection_dim or "none",
        }

    # -- MultisetSampling hooks ------------------------------------------------
    def draw_clients(
        self, node_ids: Sequence[int], sizes: NDArray[np.int64], draw: DrawRound
    ) -> NDArray[np.intp]:
        """One draw from each of the round's ``m`` distributions."""
        return sample_from_distributions(self.distributions(node_ids, sizes), self.rng)

    def track_nodes(self, node_ids: Sequence[int]) -> None:
        """Align the representative gradients with the drawable nodes."""
        if self.method == "similarity":
            self.gradients.align(node_ids)

    def keeps_updates(self) -> bool:
        """Algorithm 2 keeps every returned update as a representative gradient."""
        return self.method == "similarity"

    def record_updates(
        self,
        models: Mapping[int, NDArray[np.floating]],
        global_model: NDArray[np.floating],
    ) -> None:
        """Keep each returned model minus the global model as its client's gradient."""
        if self.method == "similarity":
            # One difference at a time in one buffer: the state keeps a copy
            # or a sketch, so no N x d array of differences is ever built.
            difference = np.empty_like(global_model)
            for node_id, model in models.items():
                np.subtract(model, global_model, out=difference)
                self.gradients.update({node_id: difference})

    # -- distributions -----------------------------------------------------------
    def distributions(
        self, node_ids: Sequence[int], sizes: NDArray[np.int64]
    ) -> NDArray[np.float64]:
        """The ``(m, N)`` distribution matrix over ``node_ids`` for this round.

        ``m`` above the number of clients ``N`` is capped at ``N``
        (docs/methods.md, section "4. Clustered sampling (and MD sampling)").
        """
        draws = min(self.clients_per_round, len(node_ids))
        if self.method == "similarity":
            return clustered_distributions_from_distances(
                sizes, self.gradients.distances(), draws
            )
        key = (tuple(node_ids), tuple(sizes.tolist()), draws)
        if self._size_distributions is None or self._size_distributions[0] != key:
            log(
                INFO,
                "clustered sampling: Algorithm 1 distributions over %d clients",
                len(node_ids),
            )
            self._size_distributions = (
                key,
                clustered_distributions_by_size(sizes, draws),
            )
        return self._size_distributions[1]


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
    """

    def __init__(
        self, distance: Distance, projection_dim: int | None, seed: int
    ) -> None:
        self.distance = distance
        self.projection_dim = projection_dim
        self.seed = seed
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
        old_row = {node_id: row for row, node_id in enumerate(self.node_ids)}
        is_new = np.array([node_id not in old_row for node_id in node_ids], bool)
        if is_new.all():
            rows = np.zeros((len(node_ids), self._rows.shape[1]), np.float32)
            distances = np.zeros((len(node_ids), len(node_ids)))
        else:
            # A new node copies old row 0 for now and is zeroed just below.
            source = np.array([old_row.get(node_id, 0) for node_id in node_ids])
            rows = self._rows.take(source, axis=0)
            distances = self._distances.take(source, axis=0).take(source, axis=1)
            rows[is_new] = 0.0
            distances[is_new, :] = 0.0
            distances[:, is_new] = 0.0
        # New nodes (zero gradients) still need their distances computed.
        new_nodes = {node_id for node_id in node_ids if node_id not in old_row}
        self._stale = (self._stale & set(node_ids)) | new_nodes
        self.node_ids = list(node_ids)
        self._row_of = {node_id: row for row, node_id in enumerate(self.node_ids)}
        self._rows, self._distances = rows, distances

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
            if self._rows.shape[1] != width:
                # First update: the dimension becomes known; every row is zero.
                self._rows = np.zeros((len(self.node_ids), width), np.float32)
            if self.projection_dim is None:
                self._rows[row] = update
            else:
                # Drawn once per update dimension, not per round: drawing
                # costs as much as sketching a few updates.
                if self._sketch is None or self._sketch.input_dim != update.size:
                    self._sketch = CountSketch(
                        update.size,
                        self.projection_dim,
                        np.random.default_rng(self.seed),
                    )
                self._sketch.apply(update, out=self._rows[row])
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
        """
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


METHOD = MethodSpec(
    name="clustered",
    strategy=ClusteredSampling,
    title="Clustered sampling",
    paper="Fraboni et al. (ICML 2021)",
    section="4-clustered-sampling-and-md-sampling",
    client_queries=(protocol.SIZES_QUERY,),
)
