"""Optimal client sampling (OCS) and its privacy-friendly approximation (AOCS).

Chen, Horváth, Richtárik, "Optimal Client Sampling for Federated Learning"
(TMLR 2022), as used by Zhang et al. (ICDCS 2024 poster); specification in
docs/methods.md §5. Its round plumbing, shared with the multi-model strategy
(:mod:`flwr_importance.strategies.mmfl`), is
:class:`~flwr_importance.strategies.unbiased_sampling.UnbiasedSampling`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_importance import protocol
from flwr_importance.aggregation.variance_reduced import size_fractions
from flwr_importance.method_spec import MethodSpec
from flwr_importance.sampling.pips import poisson_sample
from flwr_importance.sampling.variance_reduced import (
    ReportSum,
    aocs_probs,
    available_pool,
    estimator_variance,
    exact_report_sum,
    optimal_client_probs,
    uniform_client_probs,
)
from flwr_importance.strategies.base import log_settings
from flwr_importance.strategies.replies import ClientSide
from flwr_importance.strategies.report_bounds import report_cap_setting
from flwr_importance.strategies.unbiased_sampling import (
    OPTIMAL_SAMPLING_DOCS,
    SamplePlan,
    UnbiasedSampling,
)
from flwr_importance.validation import check_count

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from flwr_importance.strategies.base import StrategyOptions


@dataclass(frozen=True)
class PublicConstants:
    """What central DP fixes in advance of any report (set by CentralDP).

    Attributes
    ----------
    population_size : int
        The estimator's fixed denominator: each client's weight is
        ``1 / population_size`` (McMahan et al. 2018) and the uniform rate is
        ``m / population_size``; no weight depends on who answered.
    score_bound : float
        The public bound each update norm is clipped to in AOCS's sums.
    """

    population_size: int
    score_bound: float


class OptimalClientSampling(UnbiasedSampling):
    """Optimal client sampling (OCS), or its approximation AOCS, for one model.

    Implementation based on https://arxiv.org/abs/2010.13723

    The single-model closed form, as quoted in Zhang et al. 2024. Every round:

    1. ``query.norm`` to every connected node (or to an available pool of
       ``pool_size`` of them, drawn uniformly each round): each trains from
       the global model, keeps its update ``U_i`` in its node state and
       replies ``||U_i||`` and ``n_i``; the server forms
       ``d_i = n_i / sum_j n_j`` and
       ``u_i = d_i ||U_i||``.
    2. ``p = optimal_client_probs(u, m)`` (``aocs_probs`` when ``approximate``);
       each node is sampled independently with probability ``p_i``
       (``poisson_sample``, expected ``m`` participants).
    3. The sampled nodes get a ``train`` message without model and send their
       kept update; the server applies ``w + server_lr * sum (d_i / p_i) U_i``,
       an unbiased estimate of the full-participation step.

    With ``approximate=True`` (AOCS) the probabilities depend on the ``u_i``
    only through sums, which the server computes here from the individual
    values; :class:`~flwr_importance.compat.secure_aocs.SecureAOCSWorkflow`
    runs the same steps with every sum behind Flower's SecAgg+ (legacy API,
    docs/privacy.md), so that no individual norm, size or update reaches
    the server. With ``uniform=True`` step 2 sets ``p_i = m / N``
    (``uniform_client_probs``) and everything else stays OCS's: the control
    that isolates OCS's claim, a lower variance from the probabilities alone,
    with draws paired with OCS's for the same ``seed``. See docs/methods.md,
    section "5. Optimal client sampling (OCS, AOCS) and multi-model sampling
    (MMFL)", for the equations, the decisions and what the server learns.

    Parameters
    ----------
    clients_per_round : int
        ``m``, the expected number of participants (clamped to the number of
        nodes that answered the query).
    approximate : bool (default: False)
        Use AOCS (``aocs_probs``) instead of the exact OCS probabilities.
    aocs_iterations : int (default: 4)
        AOCS rescaling rounds ``j_max`` (4 in the authors' script).
    uniform : bool (default: False)
        Sample with ``p_i = m / N`` instead: OCS's uniform control (see above);
        not with ``approximate``.
    server_lr : float (default: 1.0)
        Server step on the estimate (1 is the authors' setting with deltas).
    pool_size : int or None (default: None)
        ``n``: each round only ``n`` connected nodes, drawn uniformly without
        repeats (``available_pool``), are queried (and train), and ``m`` are
        sampled among them, as in the authors' cross-device code (``n = 32``,
        ``m = 2-3``); ``d_i`` is then normalized over the pool. None: every
        connected node. At least ``clients_per_round``.
    report_cap : float or None (default: None)
        Clip each reported update norm, loss and size above ``report_cap``
        times the round's median of that quantity (``> 1``, logged by node);
        None: no bound (docs/deployment.md, "A dishonest node's reach").

    Other Parameters
    ----------------
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with its
        defaults: ``seed`` seeds the participation draws (one
        ``poisson_sample`` on ``self.rng`` per round, its only use of the
        generator), ``query_timeout`` bounds the wait for the ``query.norm``
        replies, and federated evaluation is on (``fraction_evaluate=1.0``):
        pass 0 to evaluate only on the server.

    Client contract
    ---------------
    The contract of :class:`~flwr_importance.strategies.mmfl.MultiModelSampling`
    (variant ``"gradnorm"``) with ``S = 1``, for OCS and AOCS alike:

    - ``query.norm`` every round to every connected node (or pool): the
      global model as the ArrayRecord ``model-0`` (not under
      ``arrayrecord_key``), config ``server-round`` and the
      ``train_config``. The node trains as for a train message, keeps its
      update ``U = w_local - w_global`` in its node state tagged with this
      round's ``server-round`` and replies ``update-norm-0`` (``||U||``, not
      ``||d_i U||``) and ``num-examples-0`` (``n_i``), both ``>= 0``;
      ``train-loss-0`` may come too (the helpers send it; unused).
    - ``train`` to each sampled node: config ``server-round``, the
      ``train_config``, ``model-index = 0`` and ``kept-update = true``, no
      arrays. Reply: the ArrayRecord ``update`` (the kept ``U``, with the
      model's keys and shapes) and one MetricRecord with ``model-index``
      (0), ``num-examples`` (``>= 0``) and, optionally, ``train-loss``. A
      node whose kept update is missing or from another round must raise
      (an error reply, left out of the round), never send it.
    - ``evaluate`` (if ``fraction_evaluate > 0``): as Flower's ``FedAvg``.

    Handlers: :mod:`flwr_importance.clientapps.variance_reduced`.

    Notes
    -----
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
        "`@app.train(mods=[KeptUpdateMod()])` "
        "(flwr_importance.clientapps.variance_reduced)",
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
        pool_size: int | None = None,
        report_cap: float | None = None,
        **options: Unpack[StrategyOptions],
    ) -> None:
        if uniform and approximate:
            raise ValueError(
                "uniform=True samples with p = m / N: it takes no approximate=True"
            )
        if pool_size is not None:
            check_count("pool_size", pool_size, clients_per_round)
        self.pool_size = pool_size
        self.approximate = approximate
        self.aocs_iterations = check_count("aocs_iterations", aocs_iterations, 0)
        self.uniform = uniform
        #: How AOCS takes its sums (:data:`ReportSum`); CentralDP's noisy sums.
        self.report_sum: ReportSum = exact_report_sum
        #: Set by CentralDP: the public weights and bound (None: the plain method).
        self.public_constants: PublicConstants | None = None
        super().__init__(
            clients_per_round=clients_per_round,
            server_lr=server_lr,
            report_cap=report_cap,
            **options,
        )

    def summary(self) -> None:
        """Log the method's parameters, then the shared ones."""
        settings: dict[str, object] = {
            "Expected participants m": self.clients_per_round,
            "Server lr": f"{self.server_lr:g}",
        }
        if self.approximate:
            settings["AOCS iterations"] = self.aocs_iterations
        if self.pool_size is not None:
            settings["Available pool n"] = self.pool_size
        settings.update(report_cap_setting(self.report_cap))
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
        """Query the nodes' update norms, compute ``p``, sample independently.

        The nodes are every connected one, or the round's available pool.
        """
        node_ids, query_config = self.round_population(grid, server_round, config)
        if self.pool_size is not None:
            node_ids = available_pool(node_ids, self.pool_size, self.rng)
        answered, (norms, sizes) = self.query_matrix(
            grid,
            dict.fromkeys(node_ids, query_config),
            protocol.NORM_QUERY,
            [protocol.UPDATE_NORM, protocol.NUM_EXAMPLES],
            1,
            {protocol.model_record_name(0): arrays},
        )
        norms = self.bounded(norms, answered, protocol.UPDATE_NORM)
        public = self.public_constants
        if public is None:
            fractions = size_fractions(
                self.bounded(sizes, answered, protocol.NUM_EXAMPLES)
            )
            population, score_bound = len(answered), np.inf
        else:
            # Central DP: equal public weights, so that no client's weight
            # depends on another's report or on how many answered.
            fractions = np.full_like(norms, 1.0 / public.population_size)
            population = public.population_size
            score_bound = public.score_bound / public.population_size
        scores = fractions * norms
        if self.uniform:
            probs = uniform_client_probs(
                len(answered), self.clients_per_round, population_size=population
            )
        elif self.approximate:
            probs = aocs_probs(
                scores[:, 0],
                self.clients_per_round,
                self.aocs_iterations,
                report_sum=self.report_sum,
                score_bound=score_bound,
                population_size=population,
            )
        else:
            probs = optimal_client_probs(scores[:, 0], self.clients_per_round)
        sampled = poisson_sample(probs, self.rng)
        assigned = {answered[row]: 0 for row in sampled}
        plan = SamplePlan(
            server_round=server_round,
            arrays=arrays,
            nodes=frozenset(assigned),
            node_ids=tuple(answered),
            fractions=fractions,
            probs=probs[:, None],
            assigned=assigned,
            models=(arrays,),
            scores=scores,
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
    client_handlers="flwr_importance.clientapps.variance_reduced:make_ocs_handlers",
    legacy="flwr_importance.compat.ocs:OptimalClientSampling",
    uniform_sampling_option="uniform",
)
