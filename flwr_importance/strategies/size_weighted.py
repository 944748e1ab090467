"""Size-weighted client sampling: the client-level baseline FedSampling improves on."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from logging import INFO, WARNING

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_importance.aggregation import weighted_sum
from flwr_importance.aggregation.fedsampling import size_weighted_draws
from flwr_importance.protocol import (
    NUM_EXAMPLES,
    SERVER_ROUND,
    SIZES_QUERY,
    query_message_type,
)
from flwr_importance.strategies.common import (
    CheckedFedAvg,
    check_replies,
    combine_arrays,
    connected_nodes,
    send_query,
    warn_if_fewer_nodes,
)


class SizeWeightedSampling(CheckedFedAvg):
    """Clients drawn with probability proportional to their TRUE size.

    The weighted client sampling baseline of FedSampling (Qi et al., IJCAI 2023,
    Section 4.3), after Li et al. (FedProx, 2020): each round ``m`` independent
    draws with replacement, ``P(node k) = n_k / sum_l n_l``; each drawn node
    trains once (plain local SGD) and the models are averaged with weight
    ``count_k / m`` per node (equal weight per draw), an unbiased estimate of the
    size-weighted average of all nodes' models.

    **It needs every node's true sample size**, which the server learns from a
    ``query.sizes`` round trip: this is the privacy cost FedSampling avoids.
    Sizes are queried once per node (when it is first seen) and kept by node
    id; nodes that leave are forgotten, nodes that join are queried.

    Parameters
    ----------
    clients_per_round : int
        Number of draws ``m`` per round (distinct nodes may be fewer).
    seed : int (default: 0)
        Seed of the server's draws.
    min_available_nodes : int (default: 2)
        Nodes to wait for before a round.
    fraction_evaluate, min_evaluate_nodes
        Federated evaluation, as in ``FedAvg`` (off by default).
    query_timeout : float (default: 600.0)
        Seconds to wait for size replies.
    arrayrecord_key, configrecord_key : str
        Keys of the model and the config in the train messages.

    Client contract
    ---------------
    - ``query.sizes`` (no config needed); reply: a MetricRecord with
      ``num-examples``, the node's true size (a non-negative integer).
    - ``train``: the model under ``arrays`` and ``server-round`` in the config,
      as Flower's ``FedAvg``; reply: the trained model (one ArrayRecord with
      the model's keys and shapes); metrics are not used.
    - Round metrics: ``num-distinct-clients``, ``num-updates``.

    Handlers: :func:`~flwr_importance.clientapps.sizes.add_size_query` beside
    your own train function, or the ready-made
    :func:`~flwr_importance.clientapps.sizes.make_sizes_handler` and
    :func:`~flwr_importance.clientapps.make_train_handler`.
    """

    # pylint: disable=too-many-arguments
    def __init__(
        self,
        clients_per_round: int,
        seed: int = 0,
        *,
        min_available_nodes: int = 2,
        fraction_evaluate: float = 0.0,
        min_evaluate_nodes: int = 2,
        query_timeout: float = 600.0,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
    ) -> None:
        if clients_per_round < 1:
            raise ValueError(f"clients_per_round must be >= 1, got {clients_per_round}")
        super().__init__(
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=1,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
        )
        self.clients_per_round = clients_per_round
        self.seed = seed
        self.query_timeout = query_timeout
        self._rng = np.random.default_rng(seed)
        self._sizes: dict[int, int] = {}
        self._draw_counts: dict[int, int] = {}
        self._arrays: ArrayRecord | None = None

    def summary(self) -> None:
        """Log the baseline's parameters, then FedAvg's."""
        log(INFO, "\t├──> Size-weighted client sampling (reveals true sizes):")
        log(
            INFO,
            "\t│\t└── Draws per round: %d | seed: %d",
            self.clients_per_round,
            self.seed,
        )
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Learn new nodes' sizes, draw ``m`` clients by size, send them the model."""
        self._draw_counts, self._arrays = {}, arrays
        available = connected_nodes(grid, self.min_available_nodes)
        warn_if_fewer_nodes(
            len(available), self.clients_per_round, "the draws repeat nodes"
        )
        self._update_sizes(server_round, available, grid)
        candidates = [node_id for node_id in available if self._sizes.get(node_id)]
        if not candidates:
            log(WARNING, "configure_train: no node with a known positive size")
            return []
        counts = size_weighted_draws(
            [self._sizes[node_id] for node_id in candidates],
            self.clients_per_round,
            self._rng,
        )
        self._draw_counts = {
            node_id: int(count)
            for node_id, count in zip(candidates, counts, strict=True)
            if count > 0
        }
        log(
            INFO,
            "configure_train: %d draws, %d distinct nodes (out of %d)",
            self.clients_per_round,
            len(self._draw_counts),
            len(available),
        )
        config[SERVER_ROUND] = server_round
        record = RecordDict(
            {self.arrayrecord_key: arrays, self.configrecord_key: config}
        )
        return self._construct_messages(
            record, list(self._draw_counts), MessageType.TRAIN
        )

    def _update_sizes(
        self, server_round: int, available: Sequence[int], grid: Grid
    ) -> None:
        """Forget departed nodes; query the true size of nodes not seen yet."""
        connected = set(available)
        self._sizes = {
            node_id: size
            for node_id, size in self._sizes.items()
            if node_id in connected
        }
        unknown = [node_id for node_id in available if node_id not in self._sizes]
        if not unknown:
            return
        replies = send_query(
            grid,
            # The round lets a client (and fault injection) tell retries apart.
            dict.fromkeys(unknown, ConfigRecord({SERVER_ROUND: server_round})),
            SIZES_QUERY,
            timeout=self.query_timeout,
        )
        for reply in check_replies(
            replies.values(),
            nonnegative_keys=[NUM_EXAMPLES],
            context=f"configure_train: {query_message_type(SIZES_QUERY)}",
        ):
            size = reply.metrics[NUM_EXAMPLES]
            if size != int(size):
                log(
                    WARNING,
                    "configure_train: size of node %d excluded: %r is no integer",
                    reply.node_id,
                    size,
                )
                continue
            self._sizes[reply.node_id] = int(size)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Average the returned models with weight ``count_k`` (renormalized)."""
        if self._arrays is None or not self._draw_counts:
            return None, None
        checked = [
            reply
            for reply in check_replies(replies, expected_arrays=self._arrays)
            if reply.node_id in self._draw_counts
        ]
        metrics = MetricRecord(
            {
                "num-distinct-clients": float(len(self._draw_counts)),
                "num-updates": float(len(checked)),
            }
        )
        if not checked:
            return None, metrics
        # Renormalizing over the nodes that answered keeps the weights summing to
        # one when a drawn node fails.
        counts = np.array([self._draw_counts[reply.node_id] for reply in checked])
        weights = counts / counts.sum()
        arrays = combine_arrays(
            [reply.array_record for reply in checked],
            lambda models: weighted_sum(models, weights),
            self._arrays,
        )
        return arrays, metrics
