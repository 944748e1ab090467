"""Optimal client sampling (OCS) and its privacy-friendly approximation (AOCS).

Chen, Horváth, Richtárik, "Optimal Client Sampling for Federated Learning"
(TMLR 2022), as used by Zhang et al. (ICDCS 2024 poster); specification in
docs/methods.md §5. The round plumbing shared with the multi-model strategy
(:mod:`flwr_importance.strategies.mmfl`), :class:`UnbiasedSampling`, lives
here too: the single model is the case ``S = 1`` of the same client contract
(:mod:`flwr_importance.clientapps.optimal`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.aggregation.optimal import size_fractions, unbiased_update
from flwr_importance.method_spec import MethodSpec
from flwr_importance.sampling import (
    aocs_probs,
    estimator_variance,
    optimal_client_probs,
    poisson_sample,
)
from flwr_importance.sampling.optimal import uniform_client_probs
from flwr_importance.strategies.arrays import combine_arrays
from flwr_importance.strategies.base import ImportanceStrategy, RoundPlan, log_settings
from flwr_importance.strategies.checks import check_count, check_positive
from flwr_importance.strategies.messages import connected_nodes, warn_if_fewer_nodes
from flwr_importance.strategies.replies import (
    CheckedReply,
    ClientSide,
    ReplyLedger,
    ReplyProblem,
    array_record_problem,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from flwr_importance.strategies.base import StrategyOptions


#: The section of docs/methods.md on OCS, AOCS and MMFL (their client lines).
OPTIMAL_SAMPLING_DOCS = (
    "docs/methods.md#5-optimal-client-sampling-ocs-aocs-and-multi-model-sampling-mmfl"
)


@dataclass(frozen=True)
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
    server_lr : float
        Server step on the estimate.
    **options
        The shared settings of :class:`ImportanceStrategy`.
    """

    def __init__(
        self,
        *,
        clients_per_round: int,
        server_lr: float = 1.0,
        **options: Unpack[StrategyOptions],
    ) -> None:
        self.clients_per_round = check_count("clients_per_round", clients_per_round)
        self.server_lr = check_positive("server_lr", server_lr)
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
            ``train-loss`` (mean over the usable replies, when there are any).
        """
        usable = [
            reply
            for reply in self.check_replies(
                replies,
                metric_keys=[protocol.TRAIN_LOSS, protocol.MODEL_INDEX],
                nonnegative_keys=[protocol.NUM_EXAMPLES],
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
            new_models[model_index] = _stepped_model(
                model,
                [reply.arrays[protocol.UPDATE_RECORD] for reply in group],
                plan.fractions[rows, model_index],
                plan.probs[rows, model_index],
                self.server_lr,
            )
        if usable:
            metrics[protocol.TRAIN_LOSS] = float(
                np.mean([reply.metrics[protocol.TRAIN_LOSS] for reply in usable])
            )
        return new_models, metrics


def _update_is_usable(
    reply: CheckedReply, plan: SamplePlan, ledger: ReplyLedger
) -> bool:
    """Whether the reply is for its assigned model and its update fits it (logged).

    The reply is from a sampled node (:meth:`check_replies` dropped others);
    ``ledger`` counts it if it is dropped.
    """
    model_index = plan.assigned[reply.node_id]
    problem: ReplyProblem | None
    if reply.metrics[protocol.MODEL_INDEX] != model_index:
        problem = ReplyProblem(
            f"not sampled for model {reply.metrics[protocol.MODEL_INDEX]} this round",
            "bad value",
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


def _stepped_model(
    model: ArrayRecord,
    updates: list[ArrayRecord],
    fractions: NDArray[np.float64],
    probs: NDArray[np.float64],
    server_lr: float,
) -> ArrayRecord:
    """``w + server_lr * sum_i (d_i / p_i) U_i`` (the unbiased step), array-wise."""
    return combine_arrays(
        [model, *updates],
        lambda vectors: (
            vectors[0] + server_lr * unbiased_update(vectors[1:], fractions, probs)
        ),
        model,
    )


class OptimalClientSampling(UnbiasedSampling):
    """Optimal client sampling (OCS), or its approximation AOCS, for one model.

    Chen, Horváth, Richtárik, "Optimal Client Sampling for Federated Learning",
    TMLR 2022 (the single-model closed form quoted in Zhang et al. 2024;
    docs/methods.md §5). Every round:

    1. ``query.norm`` to every connected node: each trains from the global model,
       keeps its update ``U_i`` in its node state and replies ``||U_i||`` and
       ``n_i``; the server forms ``d_i = n_i / sum_j n_j`` and
       ``u_i = d_i ||U_i||``.
    2. ``p = optimal_client_probs(u, m)`` (``aocs_probs`` when ``approximate``);
       each node is sampled independently with probability ``p_i``
       (``poisson_sample``, expected ``m`` participants).
    3. The sampled nodes get a ``train`` message without model and send their
       kept update; the server applies ``w + server_lr * sum (d_i / p_i) U_i``,
       an unbiased estimate of the full-participation step.

    **What the server learns** (a design decision; the paper has each client
    send ``||d_i U_i||``, which needs ``sum_j n_j`` on the client): every node's
    update norm ``||U_i||`` and sample count ``n_i`` (which FedAvg's
    ``num-examples`` reveals anyway), and the updates of the sampled nodes only.
    With ``approximate=True`` (AOCS, docs/methods.md §5) the probabilities depend on
    the ``u_i`` only through sums: ``sum u_i``, then per iteration the sum of the
    below-one probabilities and their count. Here those sums are simulated by
    summing on the server, which still receives the individual values; a
    deployment would compute them with Flower's secure aggregation
    (``flwr.server.workflow.SecAggPlusWorkflow``) so that no individual norm
    reaches the server, and each client would compute its own ``p_i``.

    **The uniform control** (``uniform=True``) is this strategy with one
    change: step 2 sets ``p_i = m / N`` (``uniform_client_probs``). It is the
    baseline that isolates OCS's claim (a lower variance from the
    probabilities alone), so everything else stays OCS's:

    - the ``query.norm`` round trip. Sampling ignores the norms, but the
      replies carry the ``n_i`` of ``d_i = n_i / sum_j n_j`` over the whole
      population (the server learns them no other way), they define the
      population ``N`` (the nodes that answered), and the sampled nodes send
      the update they kept, so a node's ``U_i`` is the one it sends under OCS.
      The cost is OCS's too: every node trains each round, in the query.
    - the unbiased estimator ``sum (d_i / p_i) U_i``;
    - the draw: one ``poisson_sample`` on ``self.rng`` per round, its only
      use of the generator, taking one uniform per node of the population.

    The draws are therefore *paired*: two runs with the same ``seed`` whose
    populations had the same sizes so far draw, in round ``t``, the same
    uniforms ``u_1..u_N`` for the nodes sorted by id, and node ``i`` takes
    part iff ``u_i < p_i``: iff ``u_i < m / N`` under the control, iff
    ``u_i < p_i^OCS`` under OCS. A node that the control samples is sampled
    by OCS too wherever ``p_i^OCS >= m / N``, and conversely below: the two
    samples differ only where the probabilities do.

    Parameters
    ----------
    clients_per_round : int
        ``m``, the expected number of participants (clamped to the number of
        nodes that answered the query).
    approximate : bool, default False
        Use AOCS (``aocs_probs``) instead of the exact OCS probabilities.
    aocs_iterations : int, default 4
        AOCS rescaling rounds ``j_max`` (4 in the authors' script).
    uniform : bool, default False
        Sample with ``p_i = m / N`` instead: OCS's uniform control (see above);
        not with ``approximate``.
    server_lr : float, default 1.0
        Server step on the estimate (1 is the authors' setting with deltas).
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with its
        defaults: ``seed`` seeds the participation draws, ``query_timeout``
        bounds the wait for the ``query.norm`` replies, and federated
        evaluation is on (``fraction_evaluate=1.0``; it was 0 before the
        defaults were shared: pass 0 to evaluate only on the server).

    Client contract (:mod:`flwr_importance.clientapps.optimal`, ``S = 1``)
    ---------------------------------------------------------------------
    ``query.norm``: ArrayRecord ``model-0`` (the global model, named by the
    protocol rather than ``arrayrecord_key``), config ``server-round``; reply
    metrics ``update-norm-0`` and ``num-examples-0`` (nonnegative), the update
    kept in the node state for that round.
    ``train``: config ``server-round``, ``model-index = 0``,
    ``kept-update = true``, no arrays; reply ArrayRecord ``update``
    (``w_local - w_global``, the model's keys and shapes) and metrics
    ``num-examples``, ``train-loss``, ``model-index``. A node that lost its kept
    update replies with an error and is skipped.
    ``evaluate`` (if ``fraction_evaluate > 0``): Flower's usual evaluate message.

    Round metrics: ``num-sampled``, ``num-received``, ``train-loss``,
    ``expected-participants`` (``sum p``) and, with exact OCS or its uniform
    control, ``variance`` (``sum u_i^2 (1/p_i - 1)``, the estimator's variance
    given this round's updates) and ``uniform-variance`` (the same for
    ``p_i = m / N``, equal to ``variance`` under the control).
    """

    fewer_nodes_effect = (
        "every node takes part with probability 1 (no sampling, variance 0)"
    )
    client_side = ClientSide(
        "add `add_norm_query(app, train)` and "
        "`@app.train(mods=[KeptUpdateMod()])` (flwr_importance.clientapps.optimal)",
        OPTIMAL_SAMPLING_DOCS,
    )

    def __init__(
        self,
        *,
        clients_per_round: int,
        approximate: bool = False,
        aocs_iterations: int = 4,
        uniform: bool = False,
        server_lr: float = 1.0,
        **options: Unpack[StrategyOptions],
    ) -> None:
        if uniform and approximate:
            raise ValueError(
                "uniform=True samples with p = m / N: it takes no approximate=True"
            )
        self.approximate = approximate
        self.aocs_iterations = check_count("aocs_iterations", aocs_iterations, 0)
        self.uniform = uniform
        super().__init__(
            clients_per_round=clients_per_round, server_lr=server_lr, **options
        )

    def summary(self) -> None:
        """Log the method's parameters, then the shared ones."""
        settings: dict[str, object] = {
            "Expected participants m": self.clients_per_round,
            "Server lr": f"{self.server_lr:g}",
        }
        if self.approximate:
            settings["AOCS iterations"] = self.aocs_iterations
        log_settings(f"OptimalClientSampling ({self.mode_name})", settings)
        super().summary()

    @property
    def mode_name(self) -> str:
        """``"OCS"``, ``"AOCS"`` or ``"uniform"`` (the control)."""
        if self.uniform:
            return "uniform"
        return "AOCS" if self.approximate else "OCS"

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Query every node's update norm, compute ``p``, sample independently."""
        node_ids, query_config = self.round_population(grid, server_round, config)
        answered, (norms, sizes) = self.query_matrix(
            grid,
            dict.fromkeys(node_ids, query_config),
            protocol.NORM_QUERY,
            [protocol.UPDATE_NORM, protocol.NUM_EXAMPLES],
            1,
            {protocol.model_record_name(0): arrays},
        )
        fractions = size_fractions(sizes)
        scores = fractions * norms
        if self.uniform:
            probs = uniform_client_probs(len(answered), self.clients_per_round)
        elif self.approximate:
            probs = aocs_probs(
                scores[:, 0], self.clients_per_round, self.aocs_iterations
            )
        else:
            probs = optimal_client_probs(scores[:, 0], self.clients_per_round)
        sampled = poisson_sample(probs, self.rng)
        assigned = {answered[row]: 0 for row in sampled}
        plan = SamplePlan(
            server_round,
            arrays,
            frozenset(assigned),
            tuple(answered),
            fractions,
            probs[:, None],
            assigned,
            (arrays,),
            scores,
        )
        self.keep_plan(plan)
        log(
            INFO,
            "configure_train: %d of %d nodes sampled (expected %.2f)",
            len(sampled),
            len(answered),
            probs.sum(),
        )
        return self.train_messages(plan, config, send_models=False)

    def aggregate_round(
        self, plan: SamplePlan, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Apply the unbiased ``w + server_lr * sum (d_i / p_i) U_i``."""
        (model,), metrics = self.unbiased_step(plan, replies)
        probs = plan.probs[:, 0]
        metrics["expected-participants"] = float(probs.sum())
        # No population: every node failed its norm query; nothing to compare.
        if not self.approximate and probs.size > 0 and plan.scores is not None:
            # The norms are known exactly here, so the round's variance is too.
            uniform = uniform_client_probs(probs.size, self.clients_per_round)
            norms = plan.scores[:, 0]
            metrics["variance"] = estimator_variance(norms, probs)
            metrics["uniform-variance"] = estimator_variance(norms, uniform)
        return model, MetricRecord(dict(metrics))


METHOD = MethodSpec(
    name="ocs",
    strategy=OptimalClientSampling,
    client_handlers="flwr_importance.clientapps.optimal:make_ocs_handlers",
    legacy="flwr_importance.compat.ocs:OptimalClientSampling",
)
