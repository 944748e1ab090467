"""AOCS with every client quantity as a SecAgg+ secure sum (a legacy fit workflow)."""

from __future__ import annotations

import json
from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.common.logger import log
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid
from numpy.typing import NDArray

from flwr_importance import protocol
from flwr_importance.aggregation.secure_sum import check_no_wraparound
from flwr_importance.compat.ocs import OptimalClientSampling
from flwr_importance.compat.secure_sum_step import ScalarDict, secure_sum
from flwr_importance.compat.transport import ProxyGrid
from flwr_importance.sampling.variance_reduced import (
    AOCS_MAX_TOTALS_SUMS,
    aocs_next_scale,
    aocs_start_factor,
    available_pool,
)
from flwr_importance.strategies.ocs import (
    OptimalClientSampling as MessageOptimalClientSampling,
)

#: A public bound that a value exceeded is multiplied by this and the sum redone.
BOUND_GROWTH = 256.0
#: A total below ``bound / BOUND_SLACK`` is summed again with ``bound = 2 total``
#: (so every revealed total has a relative error below ``4 N BOUND_SLACK / Q``).
BOUND_SLACK = 8.0
#: Tries of the totals' sum before the round is given up.
MAX_TOTALS_TRIES = AOCS_MAX_TOTALS_SUMS


class SecureAOCSWorkflow:
    """AOCS (Chen, Horváth, Richtárik, TMLR 2022) with SecAgg+ sums only.

    Implementation based on https://arxiv.org/abs/2010.13723

    AOCS needs only sums of client quantities ("compatible with secure
    aggregation" in the paper); this fit workflow routes each one through
    Flower's SecAgg+ (``SecAggPlusWorkflow``, one run per sum, each with a
    :class:`~flwr_importance.compat.secure_sum_step.SecureSumStep` as its
    strategy). Use it with the legacy ``compat.OptimalClientSampling(
    approximate=True, ...)`` as the strategy::

        workflow = DefaultWorkflow(
            fit_workflow=SecureAOCSWorkflow(
                secure_aggregation=SecAggPlusWorkflow(
                    num_shares=..., reconstruction_threshold=..., max_weight=1
                )
            )
        )

    A round (``v_i = n_i ||U_i||`` is ``u_i`` times the public ``sum_j n_j``):

    1. the strategy's pool (its ``rng``, as in plaintext) gets OCS's norm
       query in the clear; each node trains, keeps ``U_i``, ``v_i`` and
       ``n_i``, and replies no number;
    2. secure sums: ``V = sum v_i`` and ``n = sum n_i`` (over public bounds
       grown when a node flags a value above them), then for each AOCS
       iteration ``P`` and ``I`` (``aocs_mass_terms``), the server
       broadcasting ``m / V`` and the rescalings (``aocs_start_factor``,
       ``aocs_next_scale``) from which each node computes its own ``p_i``;
    3. each node draws its own coin ``r_i`` (OS entropy) and answers whether
       ``r_i < p_i``: the server learns one Bernoulli(``p_i``) bit per node;
    4. a secure sum over the participants of ``(n_i / p_i) U_i / (2 V)``
       (scaled into SecAgg+'s clipping range; never clipped, as its norm is
       at most ``V``), and ``w + server_lr (2 V / n) sum``.

    So the server learns ``V``, ``n``, every ``P`` and ``I``, how many values
    were above a public bound, who participates, and the estimate's sum.
    Before the first secure sum of a round the pool is checked against the
    most replies a SecAgg+ sum adds without wrapping around
    (:func:`~flwr_importance.aggregation.secure_sum.check_no_wraparound`).
    A round whose pool has fewer than 2 nodes, or with fewer than 2
    participants, keeps the model (SecAgg+ cannot sum one vector), which
    biases the step (docs/privacy.md); so does a sum a node drops out of.
    Each revealed sum carries SecAgg+'s quantization error (bound in
    docs/privacy.md, logged each round as ``quantization-bound``).

    Parameters
    ----------
    secure_aggregation : SecAggPlusWorkflow
        Flower's workflow, run once per sum; its ``max_weight`` must be a
        whole number (each node sends it as its weight, so every vector
        counts once); its ``clipping_range`` and ``quantization_range`` set
        the precision.
    unsafe_public_draws : bool (default: False)
        Send each node the strategy's seeded draw ``r_i`` (``poisson_sample``'s)
        for its participation coin, so that the secure run samples the plain
        run's nodes (tests compare the two). Unsafe for privacy: a server
        that chooses ``r_i`` reads ``v_i > r_i / g`` exactly from the answer.
        The node uses the draw only if its run config also sets
        ``secure-aocs-unsafe-public-draws = true``.

    Raises
    ------
    ValueError
        A ``max_weight`` that is not a positive whole number; before a
        round's first secure sum, a pool above the wrap-around limit.
    TypeError
        At the first round, a strategy that is not the legacy
        ``OptimalClientSampling(approximate=True)`` without ``report_cap``.

    Client contract
    ---------------
    ``ClientApp(client_fn=compat.importance_client_fn(client_fn), mods=[
    importance_secaggplus_mod, secure_aocs_mod])`` (or ``handler_client_fn``
    with ``make_ocs_handlers``): the messages and keys are on
    docs/protocol.md (OCS section, "AOCS under SecAgg+").
    """

    def __init__(
        self,
        *,
        secure_aggregation: SecAggPlusWorkflow,
        unsafe_public_draws: bool = False,
    ) -> None:
        weight = secure_aggregation.max_weight
        if weight < 1 or weight != int(weight):
            raise ValueError(
                f"SecAggPlusWorkflow's max_weight must be a whole number >= 1 (each "
                f"node sends it as its weight), got {weight}"
            )
        self.secure_aggregation = secure_aggregation
        self.unsafe_public_draws = unsafe_public_draws
        #: The public bounds on ``v_i`` and ``n_i``, adapted round to round.
        self.bounds = np.ones(2)

    def __call__(self, grid: Grid, context: LegacyContext) -> None:
        """Run one round of secure AOCS; the new model goes to the context."""
        legacy, method = _legacy_strategy(context)
        server_round = int(
            context.state.config_records[MAIN_CONFIGS_RECORD][WorkflowKey.CURRENT_ROUND]  # type: ignore[arg-type]
        )
        model = context.state.array_records[MAIN_PARAMS_RECORD]
        config = (
            legacy.on_fit_config_fn(server_round) if legacy.on_fit_config_fn else {}
        )
        proxy_grid = ProxyGrid(context.client_manager, legacy.max_workers)
        if method.pool_size is not None:
            self._check_no_wraparound(method.pool_size, f"pools of {method.pool_size}")
        population = self._train(method, proxy_grid, server_round, config, model)
        self._check_no_wraparound(
            len(population), f"{len(population)} nodes answered round {server_round}"
        )
        draws = method.rng.random(len(population))
        metrics: dict[str, float] = {"num-pool": len(population), "num-sampled": 0}
        public: ScalarDict = {
            protocol.SERVER_ROUND: server_round,
            protocol.CLIPPING_RANGE: self.secure_aggregation.clipping_range,
            protocol.SECURE_SUM_WEIGHT: int(self.secure_aggregation.max_weight),
        }
        step = self._secure_step(
            grid, context, (method, proxy_grid), (population, draws), public, metrics
        )
        if step is None:
            log(INFO, "secure AOCS, round %d: the model is unchanged", server_round)
        else:
            context.state.array_records[MAIN_PARAMS_RECORD] = _stepped(
                model, step, method.server_lr
            )
        context.history.add_metrics_distributed_fit(
            server_round=server_round, metrics=dict(metrics)
        )

    def _check_no_wraparound(self, num_nodes: int, what: str) -> None:
        """Refuse, before any secure sum, a pool whose sums would wrap around."""
        check_no_wraparound(
            num_nodes,
            self.secure_aggregation.quantization_range,
            self.secure_aggregation.modulus_range,
            what=what,
        )

    def _train(
        self,
        method: MessageOptimalClientSampling,
        grid: ProxyGrid,
        server_round: int,
        config: ScalarDict,
        model: ArrayRecord,
    ) -> list[int]:
        """The pool's training query, in the clear: the nodes that answered."""
        node_ids, query_config = method.round_population(
            grid, server_round, ConfigRecord(dict(config))
        )
        if method.pool_size is not None:
            node_ids = available_pool(node_ids, method.pool_size, method.rng)
        query_config[protocol.SECURE_AOCS_STEP] = protocol.AOCS_TRAIN_STEP
        replies = method.query(
            grid,
            dict.fromkeys(node_ids, query_config),
            protocol.NORM_QUERY,
            {protocol.model_record_name(0): model},
        )
        return sorted(replies)

    def _secure_step(
        self,
        grid: Grid,
        context: LegacyContext,
        strategy: tuple[MessageOptimalClientSampling, ProxyGrid],
        pool: tuple[list[int], NDArray[np.float64]],
        public: ScalarDict,
        metrics: dict[str, float],
    ) -> list[NDArray[np.float64]] | None:
        """``sum_{i in S} (d_i / p_i) U_i`` by secure sums, or None (logged).

        ``strategy`` is the Message-API AOCS and the grid of its plain
        queries, ``pool`` the nodes that answered and their public draws.
        """
        method, proxy_grid = strategy
        population = pool[0]
        if len(population) < 2:
            log(WARNING, "secure AOCS: %d node(s) answered, 2 needed", len(population))
            return None
        totals = self._totals(grid, context, population, public)
        if totals is None:
            return None
        (score_total, size_total), size_bound = totals
        budget = min(method.clients_per_round, len(population))
        public[protocol.AOCS_START_FACTOR] = aocs_start_factor(score_total, budget)
        scales: list[float] = []
        relative_error = self._resolution(len(population), size_bound, size_total)
        for _ in range(method.aocs_iterations):
            public[protocol.AOCS_SCALES] = json.dumps(scales)
            sums = self._sum(grid, context, population, public, protocol.AOCS_MASS_STEP)
            if sums is None:
                return None
            mass, num_below_one = sums[0]
            scale = aocs_next_scale(mass, round(num_below_one), len(population), budget)
            if scale is None:
                break
            scales.append(scale)
            relative_error += self._resolution(len(population), 1.0, mass)
        public[protocol.AOCS_SCALES] = json.dumps(scales)
        participants = self._participants(method, proxy_grid, pool, public)
        metrics["num-sampled"] = len(participants)
        if len(participants) < 2:
            log(WARNING, "secure AOCS: %d participant(s), 2 needed", len(participants))
            return None
        bound = 2.0 * score_total
        public[protocol.UPDATE_BOUND] = bound
        sums = self._sum(grid, context, participants, public, protocol.AOCS_UPDATE_STEP)
        if sums is None:
            return None
        mean_score = score_total / size_total
        metrics["quantization-bound"] = (
            method.server_lr
            * len(participants)
            * mean_score
            * (4.0 / self.secure_aggregation.quantization_range + 2 * relative_error)
        )
        return [array * (bound / size_total) for array in sums]

    def _totals(
        self,
        grid: Grid,
        context: LegacyContext,
        population: list[int],
        public: ScalarDict,
    ) -> tuple[tuple[float, float], float] | None:
        """``(V, n)`` by secure sums over public bounds, and the size bound used.

        A bound a node's value exceeded grows (``BOUND_GROWTH``); a total far
        below its bound is summed once more over a tighter one
        (``BOUND_SLACK``); the next round starts from twice the totals.
        """
        refined = False
        for _ in range(MAX_TOTALS_TRIES):
            public[protocol.SCORE_BOUND] = float(self.bounds[0])
            public[protocol.SIZE_BOUND] = float(self.bounds[1])
            sums = self._sum(
                grid, context, population, public, protocol.AOCS_TOTALS_STEP
            )
            if sums is None:
                return None
            fractions, overflows = sums[0][:2], np.rint(sums[0][2:])
            if overflows.any():
                self.bounds = np.where(
                    overflows > 0, self.bounds * BOUND_GROWTH, self.bounds
                )
                continue
            used, totals = self.bounds, fractions * self.bounds
            loose = (totals > 0) & (totals < self.bounds / BOUND_SLACK)
            if loose.any() and not refined:
                self.bounds = np.where(loose, 2.0 * totals, self.bounds)
                refined = True
                continue
            # The next round starts from this one's totals.
            self.bounds = np.where(totals > 0, 2.0 * totals, self.bounds)
            return (float(totals[0]), float(totals[1])), float(used[1])
        log(WARNING, "secure AOCS: the totals did not fit %d bounds", MAX_TOTALS_TRIES)
        return None

    def _sum(
        self,
        grid: Grid,
        context: LegacyContext,
        node_ids: list[int],
        public: ScalarDict,
        step: str,
    ) -> list[NDArray[np.float64]] | None:
        """One secure sum of ``step`` over ``node_ids``, back in its own units."""
        config = {**public, protocol.SECURE_AOCS_STEP: step}
        sums = secure_sum(
            self.secure_aggregation,
            grid,
            context,
            dict.fromkeys(node_ids, config),
        )
        if sums is None:
            return None
        return [array / self.secure_aggregation.clipping_range for array in sums]

    def _resolution(self, num_nodes: int, bound: float, total: float) -> float:
        """Relative error bound of a secure total of values within ``[0, bound]``.

        Each node's stochastic rounding is off by less than one step,
        ``2 bound / Q`` in the values' units.
        """
        if total <= 0:
            return 0.0
        return (
            2.0
            * num_nodes
            * bound
            / (self.secure_aggregation.quantization_range * total)
        )

    def _participants(
        self,
        method: MessageOptimalClientSampling,
        grid: ProxyGrid,
        pool: tuple[list[int], NDArray[np.float64]],
        public: ScalarDict,
    ) -> list[int]:
        """The nodes whose public draw fell below their own ``p_i``."""
        population, draws = pool
        step = {**public, protocol.SECURE_AOCS_STEP: protocol.AOCS_PARTICIPATION_STEP}
        # The draws are always made, so the strategy's generator moves as in
        # the plain run; they leave the server only as the unsafe test option.
        configs = {
            node: ConfigRecord(
                {**step, protocol.PARTICIPATION_DRAW: float(draw)}
                if self.unsafe_public_draws
                else dict(step)
            )
            for node, draw in zip(population, draws, strict=True)
        }
        replies = method.query(grid, configs, protocol.PARTICIPATION_QUERY)
        return sorted(
            node
            for node, reply in replies.items()
            if any(
                record.get(protocol.PARTICIPATES) == 1
                for record in reply.content.metric_records.values()
            )
        )


def _legacy_strategy(
    context: LegacyContext,
) -> tuple[OptimalClientSampling, MessageOptimalClientSampling]:
    """The context's legacy AOCS (no ``report_cap``) and its Message-API strategy."""
    legacy = context.strategy
    method = getattr(legacy, "strategy", None)
    if not (
        isinstance(legacy, OptimalClientSampling)
        and isinstance(method, MessageOptimalClientSampling)
        and method.approximate
        and method.report_cap is None
    ):
        raise TypeError(
            "SecureAOCSWorkflow runs compat.OptimalClientSampling(approximate=True) "
            f"without report_cap (the server sees no report to bound), got {legacy!r}"
        )
    return legacy, method


def _stepped(
    model: ArrayRecord, step: list[NDArray[np.float64]], server_lr: float
) -> ArrayRecord:
    """``w + server_lr * step``, array by array, in each array's dtype."""
    stepped: dict[str, Array] = {}
    for (key, array), delta in zip(model.items(), step, strict=True):
        values = array.numpy()
        stepped[key] = Array((values + server_lr * delta).astype(values.dtype))
    return ArrayRecord(stepped)
