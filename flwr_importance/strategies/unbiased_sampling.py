"""Clients sampled with known probabilities, models stepped without bias.

:class:`UnbiasedSampling` is the base OCS
(:class:`~flwr_importance.strategies.ocs.OptimalClientSampling`) and MMFL
(:class:`~flwr_importance.strategies.mmfl.MultiModelSampling`) share: the
query whose replies give a matrix per metric, the ``train`` messages of a
:class:`SamplePlan` and the unbiased step
``w_s + server_lr * sum_{i in A_s} (d_is / p_is) U_is`` per model
(:mod:`flwr_importance.aggregation.variance_reduced`); the single model is the
case ``S = 1`` of the same client contract
(:mod:`flwr_importance.clientapps.variance_reduced`). Specification:
docs/methods.md §5.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import WARNING
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType
from flwr.common.logger import log
from flwr.serverapp import Grid
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.aggregation.variance_reduced import unbiased_weights
from flwr_importance.strategies.base import ImportanceStrategy, RoundPlan
from flwr_importance.strategies.messages import connected_nodes, warn_if_fewer_nodes
from flwr_importance.strategies.replies import (
    CheckedReply,
    ReplyLedger,
    ReplyProblem,
    array_record_problem,
)
from flwr_importance.strategies.report_bounds import bound_reports, check_report_cap
from flwr_importance.validation import check_count, check_positive

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from flwr_importance.strategies.base import StrategyOptions


#: The section of docs/methods.md on OCS, AOCS and MMFL (their client lines).
OPTIMAL_SAMPLING_DOCS = (
    "docs/methods.md#5-optimal-client-sampling-ocs-aocs-and-multi-model-sampling-mmfl"
)


@dataclass(frozen=True, kw_only=True)
class SamplePlan(RoundPlan):
    """One round's sample: who trains which model, with which ``d`` and ``p``.

    Attributes
    ----------
    node_ids : tuple of int
        The round's population (the nodes that answered the query), in the row
        order of ``fractions`` and ``probs``.
    fractions : NDArray
        ``d_{i,s}``, shape ``(N, S)``: each column sums to 1.
    probs : NDArray
        ``p_{s|i}``, shape ``(N, S)``: P(node i trains model s this round).
    assigned : Mapping[int, int]
        The sampled nodes (``nodes``) and the model each trains.
    models : tuple of ArrayRecord
        The ``S`` models the round started from.
    scores : NDArray or None
        ``u_{i,s} = d_{i,s} ||U_{i,s}||`` when the round measured the update
        norms (the estimator's variance is then known), else None.
    """

    node_ids: tuple[int, ...]
    fractions: NDArray[np.float64]
    probs: NDArray[np.float64]
    assigned: Mapping[int, int]
    models: tuple[ArrayRecord, ...]
    scores: NDArray[np.float64] | None

    def row_of(self, node_id: int) -> int:
        """The matrix row of ``node_id``."""
        return self.node_ids.index(node_id)


class UnbiasedSampling(ImportanceStrategy[SamplePlan]):
    """Clients sampled with known probabilities, models stepped without bias.

    The plumbing OCS and MMFL share: a ``query.<action>`` whose replies give
    a ``(N, S)`` matrix per metric (:meth:`query_matrix`), ``train`` messages
    for a :class:`SamplePlan` (:meth:`train_messages`) and the unbiased step
    ``w_s + server_lr * sum_{i in A_s} (d_is / p_is) U_is`` per model
    (:meth:`unbiased_step`).

    Parameters
    ----------
    clients_per_round : int
        ``m``, the expected number of participants over all models.
    server_lr : float (default: 1.0)
        Server step on the estimate.
    report_cap : float or None (default: None)
        Clip each reported update norm, loss and size above ``report_cap``
        times the round's median of that quantity (``> 1``, logged by node);
        None: no bound (docs/deployment.md, "A dishonest node's reach").

    Other Parameters
    ----------------
    **options
        The shared settings of :class:`ImportanceStrategy`, with its defaults.
    """

    def __init__(
        self,
        *,
        clients_per_round: int,
        server_lr: float = 1.0,
        report_cap: float | None = None,
        **options: Unpack[StrategyOptions],
    ) -> None:
        self.clients_per_round = check_count("clients_per_round", clients_per_round)
        self.server_lr = check_positive("server_lr", server_lr)
        self.report_cap = check_report_cap(report_cap)
        super().__init__(**options)

    #: What a round does when fewer nodes are connected than ``m`` (logged).
    fewer_nodes_effect = "every node takes part"

    def round_population(
        self, grid: Grid, server_round: int, config: ConfigRecord
    ) -> tuple[list[int], ConfigRecord]:
        """The connected nodes, all queried this round, and their query config.

        Both methods ask every node before sampling.
        """
        node_ids = connected_nodes(grid, self.min_available_nodes)
        warn_if_fewer_nodes(
            len(node_ids), self.clients_per_round, self.fewer_nodes_effect
        )
        return node_ids, ConfigRecord(
            {**dict(config), protocol.SERVER_ROUND: server_round}
        )

    def query_matrix(
        self,
        grid: Grid,
        node_configs: Mapping[int, ConfigRecord],
        action: str,
        metric_prefixes: Sequence[str],
        num_models: int,
        models: Mapping[str, ArrayRecord] | None = None,
    ) -> tuple[list[int], list[NDArray[np.float64]]]:
        """The nodes that answered ``query.<action>`` well, and their metrics.

        Every reply must carry ``<prefix>-<s>`` (:func:`per_model_key`) for
        each prefix and model ``s`` as a finite nonnegative number; a reply
        that does not is logged and left out.

        Returns
        -------
        tuple
            The node ids that answered well (sorted), and for each prefix a
            matrix of shape ``(len(node_ids), num_models)`` of their values.
        """
        replies = self.query(grid, node_configs, action, models)
        keys = [
            protocol.per_model_key(prefix, s)
            for prefix in metric_prefixes
            for s in range(num_models)
        ]
        checked = sorted(
            self.check_replies(
                replies.values(),
                nonnegative_keys=keys,
                context=protocol.query_message_type(action),
            ),
            key=lambda reply: reply.node_id,
        )
        matrices = [
            np.array(
                [
                    [
                        reply.metrics[protocol.per_model_key(prefix, s)]
                        for s in range(num_models)
                    ]
                    for reply in checked
                ],
                dtype=np.float64,
            ).reshape(len(checked), num_models)
            for prefix in metric_prefixes
        ]
        return [reply.node_id for reply in checked], matrices

    def bounded(
        self, values: NDArray[np.float64], node_ids: Sequence[int], quantity: str
    ) -> NDArray[np.float64]:
        """``values`` (a row per node) clipped by ``report_cap`` (as is if None)."""
        return bound_reports(
            values, self.report_cap, node_ids, quantity, "configure_train"
        )

    def train_messages(
        self, plan: SamplePlan, config: ConfigRecord, send_models: bool
    ) -> list[Message]:
        """``train`` messages for the plan's sampled nodes.

        With ``send_models`` each node receives its model (``model-<s>``) and
        trains it now; without, it sends the update it kept from this round's
        ``query.norm`` (``kept-update = true``), so no model travels down.
        """
        messages = []
        for node_id, model_index in plan.assigned.items():
            node_config = ConfigRecord(
                {
                    **dict(config),
                    protocol.SERVER_ROUND: plan.server_round,
                    protocol.MODEL_INDEX: model_index,
                    protocol.KEPT_UPDATE: not send_models,
                }
            )
            model = (
                {protocol.model_record_name(model_index): plan.models[model_index]}
                if send_models
                else None
            )
            messages += self.build_messages(
                {node_id: node_config}, MessageType.TRAIN, model
            )
        return messages

    def unbiased_step(
        self, plan: SamplePlan, replies: Iterable[Message]
    ) -> tuple[list[ArrayRecord], dict[str, float]]:
        """Apply ``w_s + server_lr * sum_{i in A_s} (d_is / p_is) U_is`` per model.

        Replies that fail :meth:`check_replies`, come from a node the plan did
        not sample, or report another model than assigned are logged and
        skipped: the round then misses their term (nothing is made up for
        them) and no NaN can reach a model. A model without a usable reply
        keeps its weights.

        Returns
        -------
        tuple
            The new models and the round's metrics: ``num-sampled``,
            ``num-received``, ``num-received-<s>`` (S > 1 only) and
            ``train-loss`` (mean over the usable replies that report one).
        """
        usable = [
            reply
            for reply in self.check_replies(
                replies,
                metric_keys=[protocol.MODEL_INDEX],
                nonnegative_keys=[protocol.NUM_EXAMPLES],
                # Only a round metric: a project's train may not report a loss.
                optional_keys=[protocol.TRAIN_LOSS],
                expected_nodes=plan.nodes,
            )
            if _update_is_usable(reply, plan, self.reply_ledger)
        ]
        new_models = list(plan.models)
        metrics: dict[str, float] = {
            "num-sampled": len(plan.assigned),
            "num-received": len(usable),
        }
        for model_index, model in enumerate(plan.models):
            group = [
                reply for reply in usable if plan.assigned[reply.node_id] == model_index
            ]
            if len(plan.models) > 1:
                metrics[f"num-received-{model_index}"] = len(group)
            if not group:
                continue
            rows = [plan.row_of(reply.node_id) for reply in group]
            new_models[model_index] = self.release(
                model,
                [reply.arrays[protocol.UPDATE_RECORD] for reply in group],
                # The unbiased step w + server_lr * sum_i (d_i / p_i) U_i.
                self.server_lr
                * unbiased_weights(
                    plan.fractions[rows, model_index], plan.probs[rows, model_index]
                ),
            )
        losses = [
            reply.metrics[protocol.TRAIN_LOSS]
            for reply in usable
            if protocol.TRAIN_LOSS in reply.metrics
        ]
        if losses:
            metrics[protocol.TRAIN_LOSS] = float(np.mean(losses))
        return new_models, metrics


def _update_is_usable(
    reply: CheckedReply, plan: SamplePlan, ledger: ReplyLedger
) -> bool:
    """Whether the reply is for its assigned model and its update fits it (logged).

    The reply is from a sampled node (:meth:`check_replies` dropped others);
    ``ledger`` counts it if it is dropped.
    """
    model_index = plan.assigned[reply.node_id]
    replied_index = reply.metrics[protocol.MODEL_INDEX]
    problem: ReplyProblem | None
    if replied_index != model_index:
        problem = ReplyProblem(
            detail=f"not sampled for model {replied_index} this round",
            reason="bad value",
        )
    else:
        problem = array_record_problem(
            protocol.UPDATE_RECORD,
            reply.arrays.get(protocol.UPDATE_RECORD),
            plan.models[model_index],
        )
    if problem is not None:
        log(
            WARNING,
            "aggregate_train: reply from node %d excluded: %s",
            reply.node_id,
            problem,
        )
        ledger.record(MessageType.TRAIN, problem.reason)
    return problem is None
