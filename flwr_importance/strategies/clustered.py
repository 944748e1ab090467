"""Clustered sampling by sample size or by model similarity (Fraboni et al., 2021)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import INFO
from typing import TYPE_CHECKING, Literal

import numpy as np
from flwr.app import ArrayRecord
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.method_spec import MethodSpec
from flwr_importance.sampling.clustered import (
    EXACT_WARD_LIMIT,
    clustered_distributions_by_size,
    clustered_distributions_from_distances,
    sample_from_distributions,
)
from flwr_importance.sampling.distances import Distance
from flwr_importance.sampling.representatives import RepresentativeGradients
from flwr_importance.sampling.scale.incremental import (
    IncrementalTwoLevel,
    clustered_distributions_incrementally,
)
from flwr_importance.strategies._multiset import DrawRound, MultisetSampling
from flwr_importance.strategies.arrays import arrays_of
from flwr_importance.validation import check_choice, check_count

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
    for the equations, the decisions and what the server learns.

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
        :class:`~flwr_importance.sampling.scale.sketch.CountSketch`) instead of
        the full float32 update: ``N * projection_dim`` floats instead of
        ``N * d``.  The sketch is drawn once from ``seed`` and applies to every
        client and round, in ``O(d)`` time per update.  Expected distortion:
        inner products and squared L2 distances are unbiased with relative
        standard deviation at most ``sqrt(2 / projection_dim)`` (4.4% at
        1024), cosines move by about ``1 / sqrt(projection_dim)``; L1
        distances are *not* preserved (a projection keeps L2 geometry), so
        prefer ``arccos`` or ``l2`` with a projection.  ``None``: no projection.
    exact_ward_limit : int (default: 2000)
        ``EXACT_WARD_LIMIT``.  Up to this many clients, Algorithm 2 runs Ward
        on all pairs of the distance matrix kept between rounds; above it,
        the two-level
        clustering (k-means groups, then Ward on their centroids) of
        :mod:`~flwr_importance.sampling.scale.two_level`, which keeps no ``N x N``
        matrix, its k-means kept between rounds and updated for the clients
        with a new update
        (:class:`~flwr_importance.sampling.scale.incremental.IncrementalTwoLevel`,
        docs/methods.md §4).
    report_cap : float or None (default: None)
        Clip each reported size above ``report_cap`` times the round's median
        size (``> 1``, logged by node) before the draw; None: no bound
        (docs/deployment.md, "A dishonest node's reach").

    Other Parameters
    ----------------
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with its
        defaults (``seed`` seeds the draws and the sketch, ``query_timeout``
        bounds the wait for the replies to ``query.sizes``).

    Client contract
    ---------------
    :class:`~flwr_importance.strategies.md.MDSampling`'s: ``query.sizes``
    replied with a MetricRecord holding ``num-examples``; ``train`` replied
    with one ArrayRecord, the trained local model with the global model's
    keys and shapes, and a MetricRecord with ``num-examples``; ``evaluate``
    as in ``FedAvg``. Algorithm 2 computes each client's representative
    gradient on the server, as the returned model minus the global one, so
    the reply is the model, not an update.

    Handlers: :func:`~flwr_importance.clientapps.sizes.add_size_query` beside
    the user's own train and evaluate functions, or the ready-made
    :func:`~flwr_importance.clientapps.clustered.make_clustered_handlers`.

    Notes
    -----
    Round metrics: ``distinct-clients`` and ``aggregated-draws``.

    Memory (Algorithm 2): one float32 row per client (``d`` or
    ``projection_dim`` entries) and, up to ``exact_ward_limit`` clients, the
    ``N x N`` float64 distance matrix, of which only the rows of clients
    with a new update are recomputed each round; with a projection, also
    the sketch's signs and scratch arrays, three float32 arrays of about
    ``d`` entries.  1,000
    clients of a 1M-parameter model: 4 GB of float32 rows without
    projection, 4 MB with ``projection_dim=1024`` (+ 8 MB distances, + 12 MB
    sketch).  The updates are projected one at a time, through the sketch's
    ``d``-sized scratch arrays.
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
        exact_ward_limit: int = EXACT_WARD_LIMIT,
        report_cap: float | None = None,
        **options: Unpack[StrategyOptions],
    ) -> None:
        check_choice("method", method, ClusteringMethod)
        check_choice("distance", distance, Distance)
        if projection_dim is not None:
            check_count("projection_dim", projection_dim)
        check_count("exact_ward_limit", exact_ward_limit)
        super().__init__(
            clients_per_round=clients_per_round, report_cap=report_cap, **options
        )
        self.method = method
        self.distance = distance
        self.projection_dim = projection_dim
        self.exact_ward_limit = exact_ward_limit
        self.gradients = RepresentativeGradients(
            distance, projection_dim, self.seed, matrix_limit=exact_ward_limit
        )
        # Above the limit: the two-level clustering's level 1, kept between rounds.
        self._two_level = IncrementalTwoLevel(distance, seed=self.seed)
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
        self, models: Mapping[int, ArrayRecord], global_model: ArrayRecord
    ) -> None:
        """Keep each returned model minus the global model as its client's gradient.

        The arrays are read where they lie (no per-update copy); with a
        projection only sketches are subtracted
        (:meth:`~flwr_importance.sampling.representatives.RepresentativeGradients.update_from_models`),
        so no ``N x d`` array of differences is ever built.
        """
        if self.method == "similarity":
            self.gradients.update_from_models(
                {node_id: arrays_of(model) for node_id, model in models.items()},
                arrays_of(global_model),
            )

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
            if self.gradients.keeps_matrix:
                return clustered_distributions_from_distances(
                    sizes, self.gradients.distances(), draws
                )
            return clustered_distributions_incrementally(
                sizes,
                self.gradients.rows(),
                draws,
                self._two_level,
                changed=self.gradients.take_changed_rows(),
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


METHOD = MethodSpec(
    name="clustered",
    strategy=ClusteredSampling,
    client_queries=(protocol.SIZES_QUERY,),
    central_dp_refusal=(
        "its clusters and weights are built from every client's size and "
        "update: one client moves the others' probabilities"
    ),
)
