"""FedSampling: uniform data sampling with locally private client sizes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING

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

from flwr_importance.aggregation.fedsampling import server_update
from flwr_importance.protocol import (
    FEDSAMPLING_SIZE_RESPONSE,
)
from flwr_importance.sampling import estimate_total_size, ldp_alpha
from flwr_importance.strategies.common import (
    CheckedFedAvg,
    check_replies,
    combine_arrays,
    connected_nodes,
    send_query,
)


@dataclass(frozen=True)
class _RoundPlan:
    """What ``configure_train`` decided, for ``aggregate_train`` to apply."""

    arrays: ArrayRecord
    estimated_total_size: float
    raw_estimate: float
    num_size_replies: int


class FedSampling(CheckedFedAvg):
    """FedSampling (Qi et al., "FedSampling: A Better Sampling Strategy for
    Federated Learning", IJCAI 2023), Algorithm 1.

    Instead of sampling clients, every available node keeps each of its samples
    with the same probability ``K / N_tilde``, so a round uses about ``K``
    samples drawn uniformly from the pooled data, as centralized SGD would. The
    server never learns a node's size: it estimates the total ``N_tilde`` from
    randomized-response replies (eps-local differential privacy).

    Each round, from inside ``configure_train``:

    1. ``query.sizes`` to every available node; each answers ``r_c`` in
       ``{1..M-1}`` by randomized response (eq. 1). Replies that are missing,
       not integers or out of range are logged and left out.
    2. ``N_tilde = (sum_c r_c - (1 - alpha) M |C| / 2) / alpha`` (eq. 2),
       clamped to at least ``K`` (logged), since ``K / N_tilde`` must be a
       probability.
    3. ``train`` to the nodes that answered (the estimate counts only them; a
       node that did not answer would push the round above ``K`` samples).

    ``aggregate_train`` then applies ``Theta <- Theta - eta sum_c G_c`` to the
    model sent in step 3. **Decision** (METHODS.md): the sign is descent; the
    paper writes ``+ eta sum G`` with ``G`` an update. A missing or malformed
    ``G_c`` is left out (logged): the step uses the others.

    Parameters
    ----------
    samples_per_round : int
        ``K``, the expected number of samples per round (paper: 2048).
    max_size : int (default: 100)
        Size threshold ``M``: replies lie in ``{1..M-1}``, and the estimate is
        of the total of sizes clipped to ``M - 1`` (paper default 100).
    epsilon : float (default: 3.0)
        Local differential privacy budget of one size reply (paper default 3).
    server_lr : float (default: 1.0)
        ``eta``; ``sum_c G_c`` estimates the mean gradient over ``K`` samples,
        so ``eta`` plays the role of a centralized SGD step size.
    local_steps : int (default: 1)
        Extension, not in the paper: local steps per node on its kept samples
        (see :mod:`flwr_importance.clientapps.fedsampling`).
    min_available_nodes : int (default: 2)
        Nodes to wait for before a round.
    fraction_evaluate : float (default: 0.0)
        Federated evaluation is off by default: Flower's ``FedAvg`` weights
        evaluation replies by ``num-examples``, which reveals the sizes.
    min_evaluate_nodes : int (default: 2)
        As in ``FedAvg``.
    query_timeout : float (default: 600.0)
        Seconds to wait for the size replies.
    arrayrecord_key, configrecord_key : str
        Keys of the model and the config in the train messages.

    Client contract
    ---------------
    - ``query.sizes`` message, config ``max-size`` (int), ``epsilon`` (float),
      ``server-round`` (int); reply: one MetricRecord with ``size-response``,
      an integer in ``{1..M-1}`` (never the plain true size).
    - ``train`` message, the model under ``arrays`` and config
      ``server-round``, ``samples-per-round`` (``K``), ``estimated-total-size``
      (``N_tilde >= K``), ``local-steps``; reply: one ArrayRecord with the
      model's keys and shapes holding ``G_c = (1/K) sum_{s in S_c} g_s``
      (zeros if nothing was kept). No metrics are needed; the reply must not
      carry ``num-examples`` or any count of kept samples.
    - Round metrics (``aggregate_train``): ``estimated-total-size`` (the
      clamped ``N_tilde`` used), ``raw-size-estimate``, ``ldp-alpha``,
      ``num-size-replies``, ``num-updates``.

    Handlers: :mod:`flwr_importance.clientapps.fedsampling`.
    """

    # pylint: disable=too-many-arguments
    def __init__(
        self,
        samples_per_round: int,
        max_size: int = 100,
        epsilon: float = 3.0,
        server_lr: float = 1.0,
        local_steps: int = 1,
        *,
        min_available_nodes: int = 2,
        fraction_evaluate: float = 0.0,
        min_evaluate_nodes: int = 2,
        query_timeout: float = 600.0,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
    ) -> None:
        if samples_per_round < 1:
            raise ValueError(f"samples_per_round must be >= 1, got {samples_per_round}")
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        if local_steps < 1:
            raise ValueError(f"local_steps must be >= 1, got {local_steps}")
        super().__init__(
            fraction_train=1.0,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=1,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
        )
        self.samples_per_round = samples_per_round
        self.max_size = max_size
        self.epsilon = epsilon
        # Also validates max_size and epsilon, with the reason.
        self.alpha = ldp_alpha(epsilon, max_size)
        self.server_lr = server_lr
        self.local_steps = local_steps
        self.query_timeout = query_timeout
        self._plan: _RoundPlan | None = None

    def summary(self) -> None:
        """Log FedSampling's parameters, then FedAvg's."""
        log(INFO, "\t├──> FedSampling:")
        log(INFO, "\t│\t├── Samples per round K: %d", self.samples_per_round)
        log(
            INFO,
            "\t│\t├── Size threshold M: %d | epsilon: %g | alpha: %.4f",
            self.max_size,
            self.epsilon,
            self.alpha,
        )
        log(
            INFO,
            "\t│\t└── Server learning rate: %g | local steps: %d",
            self.server_lr,
            self.local_steps,
        )
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Query private sizes, estimate ``N_tilde``, send the model to responders."""
        self._plan = None
        available = connected_nodes(grid, self.min_available_nodes)
        responses = self._size_responses(server_round, available, grid)
        if not responses:
            log(WARNING, "configure_train: no usable size reply; round skipped")
            return []
        raw_estimate = estimate_total_size(
            list(responses.values()), self.max_size, self.epsilon
        )
        estimate = max(raw_estimate, float(self.samples_per_round))
        if raw_estimate < self.samples_per_round:
            log(
                WARNING,
                "configure_train: N_tilde=%.1f below K=%d (too few nodes or a small "
                "epsilon); using N_tilde=K, every sample is kept",
                raw_estimate,
                self.samples_per_round,
            )
        log(
            INFO,
            "configure_train: %d size replies, N_tilde=%.1f (alpha=%.4f)",
            len(responses),
            estimate,
            self.alpha,
        )
        self._plan = _RoundPlan(arrays, estimate, raw_estimate, len(responses))
        config["server-round"] = server_round
        config["samples-per-round"] = self.samples_per_round
        config["estimated-total-size"] = estimate
        config["local-steps"] = self.local_steps
        record = RecordDict(
            {self.arrayrecord_key: arrays, self.configrecord_key: config}
        )
        return self._construct_messages(record, list(responses), MessageType.TRAIN)

    def _size_responses(
        self, server_round: int, node_ids: Iterable[int], grid: Grid
    ) -> dict[int, int]:
        """The valid randomized size replies, by node id."""
        query = {
            "max-size": self.max_size,
            "epsilon": self.epsilon,
            "server-round": server_round,
        }
        replies = send_query(
            grid,
            {node_id: ConfigRecord(dict(query)) for node_id in node_ids},
            "sizes",
            timeout=self.query_timeout,
        )
        checked = check_replies(
            replies.values(),
            metric_keys=[FEDSAMPLING_SIZE_RESPONSE],
            context="configure_train: query.sizes",
        )
        responses: dict[int, int] = {}
        for reply in checked:
            value = reply.metrics[FEDSAMPLING_SIZE_RESPONSE]
            if value != int(value) or not 1 <= value <= self.max_size - 1:
                log(
                    WARNING,
                    "configure_train: size reply of node %d excluded: %r is not an "
                    "integer in [1, %d]",
                    reply.node_id,
                    value,
                    self.max_size - 1,
                )
                continue
            responses[reply.node_id] = int(value)
        return responses

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """``Theta - eta sum_c G_c`` over the usable replies; the round's metrics."""
        plan = self._plan
        if plan is None:
            return None, None
        checked = check_replies(replies, expected_arrays=plan.arrays)
        metrics = self._round_metrics(plan, len(checked))
        if not checked:
            return None, metrics
        # Every node trains: the G_c are read in place, array by array (a list
        # of N flattened copies would be 4 GB at 1,000 nodes and 1M parameters).
        arrays = combine_arrays(
            [plan.arrays, *(reply.array_record for reply in checked)],
            lambda vectors: server_update(vectors[0], vectors[1:], self.server_lr),
            plan.arrays,
        )
        return arrays, metrics

    def _round_metrics(self, plan: _RoundPlan, num_updates: int) -> MetricRecord:
        values: Mapping[str, float] = {
            "estimated-total-size": plan.estimated_total_size,
            "raw-size-estimate": plan.raw_estimate,
            "ldp-alpha": self.alpha,
            "num-size-replies": float(plan.num_size_replies),
            "num-updates": float(num_updates),
        }
        return MetricRecord(dict(values))
