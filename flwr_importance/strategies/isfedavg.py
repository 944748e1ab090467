"""ISFedAvg: two-level importance sampling of clients and of their data."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.aggregation.isfedavg import (
    DEFAULT_MIN_RELATIVE_CLIENT_PROB,
    realized_normalized_probs,
    update_client_probs,
)
from flwr_importance.method_spec import MethodSpec
from flwr_importance.sampling.pips import systematic_sample
from flwr_importance.strategies.base import ImportanceStrategy, RoundPlan, log_settings
from flwr_importance.strategies.messages import connected_nodes, warn_if_fewer_nodes
from flwr_importance.strategies.replies import CheckedReply, ClientSide
from flwr_importance.strategies.report_bounds import (
    bound_reports,
    check_report_cap,
    report_cap_setting,
)
from flwr_importance.validation import check_count

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from flwr_importance.strategies.base import MetricsAggregation, StrategyOptions

#: Default floor on a sample's probability ``p_n``, as a fraction of ``1/N_k``.
DEFAULT_MIN_RELATIVE_SAMPLE_PROB = 0.1


class ISFedAvg(ImportanceStrategy[RoundPlan]):
    """ISFedAvg, two-level importance sampling of clients and of their data.

    Implementation based on https://arxiv.org/abs/2010.13600

    Algorithm 1 of the paper with the probabilities of eq. 28-29. The server
    keeps a normalized inclusion probability ``p_k`` per node (sum 1, uniform
    at first) and each round selects ``L`` distinct nodes with
    ``P(k in S) = L p_k`` by Hartley–Rao randomized systematic sampling. Each
    selected node runs ``E_k`` importance-weighted SGD steps on mini-batches
    of ``B_k`` samples it draws by its own per-sample probabilities (eq. 8,
    see :mod:`flwr_importance.clientapps.isfedavg`). The new model is the
    plain mean of the returned models (eq. 5): the importance weights were
    applied on the clients. The returned statistics then update the
    participants' ``p_k`` (eq. 28), floored at ``min_relative_client_prob /
    K`` and renormalized. See docs/methods.md, section "1. ISFedAvg:
    two-level importance sampling", for the equations and the decisions
    (capping, the ``p_k`` sent, failed replies, joining nodes, ``E_k`` and
    ``B_k``).

    Parameters
    ----------
    clients_per_round : int
        ``L``; fewer when fewer nodes are connected.
    local_steps_range : tuple of int (default: (1, 5))
        Inclusive range of ``E_k``, drawn once per node from the strategy's
        seeded generator; equal bounds fix it.
    batch_size_range : tuple of int (default: (1, 10))
        Inclusive range of ``B_k``, drawn likewise. A node with fewer samples
        uses all of them.
    uniform : bool (default: False)
        Freeze ``p_k = 1/K`` and tell clients to keep their sample
        probabilities uniform: the same eq. 8 scaling (a step divided by
        ``E_k``) without importance sampling, the baseline isolating its
        effect.
    keep_app_step_size : bool (default: False)
        Tell clients to leave eq. 8's ``1/E_k`` out of each step, so that
        your app's learning rate keeps its meaning: with uniform
        probabilities the weighted loss is the batch's mean loss, the loss
        your optimizer steps on in FedAvg. The importance weights
        ``1/(K p_k N_k pi_b)`` stay, so each step's gradient is still
        unbiased for the global one; a node's update then grows with its
        ``E_k``, as in FedAvg with unequal epochs. False: the paper's step,
        ``1/E_k`` of it.
    min_relative_client_prob : float (default: 0.1)
        Floor on ``p_k`` as a fraction of ``1/K``, in ``(0, 1]``; it bounds the
        step scaling ``1/(K p_k)`` by its inverse.
    min_relative_sample_prob : float (default: 0.1)
        Floor on every client's ``p_n`` as a fraction of ``1/N_k``, sent to the
        clients, in ``(0, 1]``.
    train_metrics_aggr_fn : callable or None (default: None)
        Averages the train replies' metrics, weighted by ``weighted_by_key``
        (as in Flower's ``FedAvg``).
    report_cap : float or None (default: None)
        Clip each reported ``sigma2_k`` and ``||grad P_k||^2`` above
        ``report_cap`` times the round's median of the participants' (``> 1``,
        logged by node) before eq. 28; None: no bound (docs/deployment.md,
        "A dishonest node's reach").

    Other Parameters
    ----------------
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with its
        defaults: ``seed`` seeds client selection and the ``E_k``/``B_k``
        draws; ``query_timeout`` does not apply (ISFedAvg sends no query).

    Client contract
    ---------------
    ``train`` to each selected node: the model under ``arrayrecord_key``
    and, under ``configrecord_key``, ``server-round``, the ``train_config``
    and

    * ``isfedavg-client-prob`` (float in ``(0, 1]``): ``p_k``, the node's
      realized normalized inclusion probability ``P(k in S) / L`` (capped
      where ``L p_k > 1``);
    * ``isfedavg-num-clients`` (int): ``K``, the number of connected nodes;
    * ``isfedavg-local-steps`` (int): ``E_k``, the local SGD steps (they
      replace the app's epochs);
    * ``isfedavg-batch-size`` (int): ``B_k``, the distinct samples per batch
      (a node with fewer samples uses them all);
    * ``isfedavg-divide-by-local-steps`` (bool): whether each step takes
      eq. 8's ``1/E_k`` (False with ``keep_app_step_size=True``);
    * ``isfedavg-adapt-sample-probs`` (bool): whether to update the
      per-sample ``p_n`` by eq. 29 (False in uniform mode: ``p_n = 1/N_k``);
    * ``isfedavg-min-relative-sample-prob`` (float in ``(0, 1]``): the floor
      on every ``p_n`` as a fraction of ``1/N_k``.

    The node draws each batch of distinct samples with ``P(n in B) = pi_n``
    (``B_k p_n`` capped at 1, the excess spread over the others) and steps
    with the eq. 8 gradient ``sum_{b in B} grad Q_b / (K p_k E_k N_k pi_b)``
    (without ``E_k`` when not dividing): the weights are applied on the
    client.

    Reply: one ArrayRecord, the trained local model (not an update), and one
    MetricRecord with ``isfedavg-sigma2`` (``sigma2_k`` of eq. 22, from the
    per-sample gradient norms seen this round), ``isfedavg-g2``
    (``||grad P_k_hat||^2`` of eq. 14: the squared norm of the mean over the
    ``E_k`` steps of the importance-weighted local mean-loss gradient), both
    finite and ``>= 0``, and the ``weighted_by_key`` metric (``num-examples``,
    ``N_k >= 0``), used only to average the other metrics. A reply that
    fails these checks is logged and left out. ``evaluate``: as Flower's
    ``FedAvg``.

    Handlers: :mod:`flwr_importance.clientapps.isfedavg`.
    """

    unused_settings = frozenset({"query_timeout"})
    aggregates_train_metrics = True
    client_side = ClientSide(
        "train on the batches of "
        "`ImportanceSampler.from_message(msg, context, num_samples=...)` "
        "(flwr_importance.clientapps.isfedavg) and reply "
        "`sampler.finish(context)` with `num-examples` in the metrics",
        "docs/methods.md#1-isfedavg-two-level-importance-sampling",
    )

    def __init__(
        self,
        *,
        clients_per_round: int,
        local_steps_range: tuple[int, int] = (1, 5),
        batch_size_range: tuple[int, int] = (1, 10),
        uniform: bool = False,
        keep_app_step_size: bool = False,
        min_relative_client_prob: float = DEFAULT_MIN_RELATIVE_CLIENT_PROB,
        min_relative_sample_prob: float = DEFAULT_MIN_RELATIVE_SAMPLE_PROB,
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        report_cap: float | None = None,
        **options: Unpack[StrategyOptions],
    ) -> None:
        self.clients_per_round = check_count("clients_per_round", clients_per_round)
        self.report_cap = check_report_cap(report_cap)
        for name, (low, high) in (
            ("local_steps_range", local_steps_range),
            ("batch_size_range", batch_size_range),
        ):
            if not 1 <= low <= high:
                raise ValueError(f"{name} must be (low, high) with 1 <= low <= high")
        for name, floor in (
            ("min_relative_client_prob", min_relative_client_prob),
            ("min_relative_sample_prob", min_relative_sample_prob),
        ):
            if not 0 < floor <= 1:
                raise ValueError(f"{name} must lie in (0, 1], got {floor}")
        super().__init__(train_metrics_aggr_fn=train_metrics_aggr_fn, **options)
        self.local_steps_range = local_steps_range
        self.batch_size_range = batch_size_range
        self.uniform = uniform
        self.keep_app_step_size = keep_app_step_size
        self.min_relative_client_prob = min_relative_client_prob
        self.min_relative_sample_prob = min_relative_sample_prob
        # Per-node state, keyed by node id.
        self.client_probs: dict[int, float] = {}
        self.local_steps: dict[int, int] = {}
        self.batch_sizes: dict[int, int] = {}

    def summary(self) -> None:
        """Log the ISFedAvg settings, then the shared ones."""
        log_settings(
            "ISFedAvg",
            {
                "Clients per round L": self.clients_per_round,
                "E_k, B_k ranges (drawn once per node)": (
                    f"{self.local_steps_range}, {self.batch_size_range}"
                ),
                "Uniform probabilities": self.uniform,
                "Local step": (
                    "the app's (no 1/E_k)"
                    if self.keep_app_step_size
                    else "eq. 8's, divided by E_k"
                ),
                "Floors": (
                    f"p_k >= {self.min_relative_client_prob:g}/K, "
                    f"p_n >= {self.min_relative_sample_prob:g}/N_k"
                ),
                "Train metrics weighted by": repr(self.weighted_by_key),
                **report_cap_setting(self.report_cap),
            },
        )
        super().summary()

    # -- per-node state ----------------------------------------------------------
    def sync_nodes(self, node_ids: Iterable[int]) -> list[int]:
        """Track the connected nodes; return their ids in a fixed (sorted) order.

        Departed nodes are dropped; new ones get ``1/K`` and their ``E_k``,
        ``B_k``; then the probabilities are renormalized to sum 1.
        """
        connected = sorted(node_ids)
        current = set(connected)
        for departed in set(self.client_probs) - current:
            for table in (self.client_probs, self.local_steps, self.batch_sizes):
                del table[departed]
        new_nodes = [node for node in connected if node not in self.client_probs]
        for node in new_nodes:
            self.client_probs[node] = 1.0 / len(connected)
            self.local_steps[node] = int(
                self.rng.integers(*self.local_steps_range, endpoint=True)
            )
            self.batch_sizes[node] = int(
                self.rng.integers(*self.batch_size_range, endpoint=True)
            )
        if new_nodes:
            log(INFO, "ISFedAvg: %d new node(s) get a fair share", len(new_nodes))
        total = sum(self.client_probs.values())
        for node in connected:
            self.client_probs[node] = (
                1.0 / len(connected)
                if self.uniform
                else self.client_probs[node] / total
            )
        return connected

    def probability_vector(self, node_ids: list[int]) -> NDArray[np.float64]:
        """The stored ``p_k`` of ``node_ids``, in that order."""
        return np.array([self.client_probs[node] for node in node_ids])

    # -- training ------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Select ``L`` nodes with ``P(k in S) = L p_k``; send each its settings."""
        # Waits for min_available_nodes; the sample itself is drawn below.
        available = connected_nodes(grid, self.min_available_nodes)
        node_ids = self.sync_nodes(available)
        warn_if_fewer_nodes(
            len(node_ids),
            self.clients_per_round,
            "every node is selected every round (no importance sampling of clients)",
        )
        if not node_ids:
            log(WARNING, "configure_train: no node connected, round skipped")
            return []
        sample_size = min(self.clients_per_round, len(node_ids))
        realized = realized_normalized_probs(
            self.probability_vector(node_ids), sample_size
        )
        chosen = systematic_sample(sample_size * realized, self.rng)
        selected = frozenset(node_ids[index] for index in chosen)
        self.keep_plan(
            RoundPlan(server_round=server_round, arrays=arrays, nodes=selected)
        )
        log(
            INFO,
            "configure_train: sampled %d nodes (out of %d), p_k in [%.3g, %.3g]/K",
            len(chosen),
            len(node_ids),
            len(node_ids) * realized.min(),
            len(node_ids) * realized.max(),
        )
        node_configs = {
            node_ids[index]: self._node_config(
                config, server_round, node_ids[index], realized[index], len(node_ids)
            )
            for index in chosen
        }
        return self.build_messages(node_configs, MessageType.TRAIN, arrays)

    def _node_config(
        self,
        config: ConfigRecord,
        server_round: int,
        node_id: int,
        client_prob: float,
        num_clients: int,
    ) -> ConfigRecord:
        """The shared ``config`` plus this node's ISFedAvg settings."""
        node_config = ConfigRecord(dict(config))
        node_config[protocol.SERVER_ROUND] = server_round
        node_config[protocol.ISFEDAVG_CLIENT_PROB] = float(client_prob)
        node_config[protocol.ISFEDAVG_NUM_CLIENTS] = num_clients
        node_config[protocol.ISFEDAVG_LOCAL_STEPS] = self.local_steps[node_id]
        node_config[protocol.ISFEDAVG_BATCH_SIZE] = self.batch_sizes[node_id]
        node_config[protocol.ISFEDAVG_ADAPT_SAMPLE_PROBS] = not self.uniform
        node_config[
            protocol.ISFEDAVG_DIVIDE_BY_LOCAL_STEPS
        ] = not self.keep_app_step_size
        node_config[protocol.ISFEDAVG_MIN_RELATIVE_SAMPLE_PROB] = (
            self.min_relative_sample_prob
        )
        return node_config

    def aggregate_round(
        self, plan: RoundPlan, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Mean of the returned models (eq. 5), then eq. 28 for their nodes."""
        checked = self.check_replies(
            replies,
            nonnegative_keys=(
                protocol.ISFEDAVG_SIGMA2,
                protocol.ISFEDAVG_GRADIENT_SQ_NORM,
                self.weighted_by_key,
            ),
            expected_arrays=plan.arrays,
            # A selected node that left since keeps no probability to update.
            expected_nodes=plan.nodes & self.client_probs.keys(),
            context="ISFedAvg aggregate_train",
        )
        if not checked:
            log(WARNING, "aggregate_train: no usable reply, the model is unchanged")
            return None, None
        if len(checked) < len(plan.nodes):
            log(
                INFO,
                "aggregate_train: %d of %d selected nodes returned a usable model; "
                "averaging those",
                len(checked),
                len(plan.nodes),
            )
        # The model sent fixes the keys and dtypes of the aggregate.
        arrays = self.release(
            plan.arrays,
            [reply.array_record for reply in checked],
            np.ones(len(checked)),
            mean_of=len(plan.nodes),
        )
        if not self.uniform:
            self._update_probabilities(checked)
        return arrays, self.train_metrics(checked)

    def _update_probabilities(self, checked: list[CheckedReply]) -> None:
        """Eq. 28 over the nodes that answered; the others keep their ``p_k``."""
        node_ids = sorted(self.client_probs)
        position = {node: index for index, node in enumerate(node_ids)}
        participants = [reply.node_id for reply in checked]
        sigma2, gradient_sq_norms = (
            bound_reports(
                np.array([reply.metrics[key] for reply in checked]),
                self.report_cap,
                participants,
                key,
                "aggregate_train",
            )
            for key in (protocol.ISFEDAVG_SIGMA2, protocol.ISFEDAVG_GRADIENT_SQ_NORM)
        )
        updated = update_client_probs(
            self.probability_vector(node_ids),
            [position[node] for node in participants],
            sigma2,
            gradient_sq_norms,
            [self.local_steps[node] for node in participants],
            [self.batch_sizes[node] for node in participants],
            self.min_relative_client_prob,
        )
        self.client_probs.update(zip(node_ids, updated.tolist(), strict=True))


METHOD = MethodSpec(
    name="isfedavg",
    strategy=ISFedAvg,
    client_handlers="flwr_importance.clientapps.isfedavg:make_isfedavg_handlers",
    legacy="flwr_importance.compat.isfedavg:ISFedAvg",
    central_dp_refusal=(
        "its probabilities are normalised over every client's reported "
        "statistics: one client moves the others' weights"
    ),
)
