"""FOLB: gradient-aligned aggregation of uniformly sampled FedProx updates.

Nguyen et al., "Fast-convergent federated learning", IEEE JSAC 2021.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Literal

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_importance import protocol
from flwr_importance.aggregation.folb import (
    Denominator,
    FolbWeights,
    Mode,
    NegativeRule,
    Penalty,
    SplitVector,
    check_options,
    folb_weights,
)
from flwr_importance.method_spec import MethodSpec
from flwr_importance.sampling.schedule import uniform_client_set
from flwr_importance.strategies.arrays import array_values
from flwr_importance.strategies.base import ImportanceStrategy, RoundPlan, log_settings
from flwr_importance.strategies.messages import connected_nodes, warn_if_fewer_nodes
from flwr_importance.strategies.replies import CheckedReply, ClientSide
from flwr_importance.validation import check_choice, check_count, check_positive

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from flwr_importance.strategies.base import MetricsAggregation, StrategyOptions

Weighting = Literal["samples", "uniform"]

#: ``uniform_client_set`` streams: ``S`` (``S1``), shared with the baselines of a
#: comparison, and FOLB's own second set ``S2``.
TRAIN_STREAM = 0
REFERENCE_STREAM = 1


@dataclass(frozen=True, kw_only=True)
class FolbPlan(RoundPlan):
    """A round's draws: ``S`` (who trains) and, in the two-set mode, ``S2``.

    Attributes
    ----------
    train_draws : Counter[int]
        ``S`` (``S1``) as node id -> draws; its keys are ``nodes``.
    reference_draws : Counter[int]
        ``S2`` as node id -> draws (empty in the single-set mode).
    reference_gradients : dict[int, tuple[ArrayRecord, float]]
        The ``S2`` nodes that only answered ``query.gradient``: gradient, ``n_j``.
    """

    train_draws: Counter[int]
    reference_draws: Counter[int]
    reference_gradients: dict[int, tuple[ArrayRecord, float]]


class FOLB(ImportanceStrategy[FolbPlan]):
    """FOLB (Nguyen et al., "Fast-convergent federated learning", IEEE JSAC 2021).

    Implementation based on https://arxiv.org/abs/2007.13137

    Each round the server draws ``K`` devices uniformly, they run FedProx local
    training and return their update ``dw_k = w_k - w^t``, their full local
    gradient ``g_k`` at the received model and their sample count ``n_k``.
    Instead of averaging, the server weighs each update by how well its
    gradient aligns with the estimated global gradient of the sample-weighted
    objective ``f = sum_k (n_k / n) F_k``:

    - single-set (default, eq. 13): ``gS = sum_{j in S} n_j g_j / sum_j n_j``,
      ``c_k = <g_k, gS>``,
      ``w^{t+1} = w^t + eta sum_k (n_k c_k / sum_i n_i |c_i|) dw_k``;
      a device with ``c_k < 0`` has its update subtracted. With identical
      gradients this is FedProx's ``n_k``-weighted mean: only the weights
      differ from FedProx;
    - two-set (eqs. 9-10): a second independent draw ``S2`` of ``K`` devices
      only computes ``g_j`` (a ``query.gradient`` message, no training) and
      ``gS2`` replaces ``gS``;
    - heterogeneity-aware (eq. 18, ``psi > 0``, either mode):
      ``d_k = c_k - psi gamma_k ||g_k|| ||gS||`` replaces ``c_k``, with the
      devices' reported inexactness ``gamma_k``.

    The devices are drawn by :func:`flwr_importance.sampling.uniform_client_set`
    (a pure function of seed, round and the sorted node ids), so a FedProx or
    FedAvg baseline given the same seed trains the *same* devices: the
    aggregation is then the only difference. See docs/methods.md, section
    "2. FOLB: gradient-aligned reweighting of FedProx updates", for the
    equations and the decisions (device draws, server step scale, degenerate
    rounds).

    Parameters
    ----------
    clients_per_round : int
        ``K``, the number of uniform draws per set and round.
    proximal_mu : float (default: 0.0)
        FedProx ``mu`` sent to the clients (``proximal-mu``), as Flower's
        ``FedProx`` does.
    mode : {"single-set", "two-set"} (default: "single-set")
        Eq. 13 or eqs. 9-10.
    weighting : {"samples", "uniform"} (default: "samples")
        Weigh devices by their reported ``num-examples`` (the paper's
        objective) or all alike (the ``1/N`` objective).
    replace : bool (default: False)
        Draw with replacement (the paper's analysis) or ``K`` distinct devices
        (as FedProx's code).
    server_lr : float (default: 1.0)
        ``eta > 0``, the factor on the aggregated update.
    psi : float (default: 0.0)
        Heterogeneity weight of eq. 18; 0 is eq. 13/9.
    penalty : {"norm-product", "global-norm"} (default: "norm-product")
        ``psi gamma_k ||g_k|| ||gS||`` or ``psi gamma_k ||gS||^2``.
    negative : {"flip", "drop"} (default: "flip")
        Devices with a negative score: update subtracted or dropped.
    denominator : {"abs", "signed"} (default: "abs")
        ``sum_i n_i |c_i|`` or ``sum_i n_i c_i``.
    train_metrics_aggr_fn : callable or None (default: None)
        Averages the train replies' metrics, weighted by ``weighted_by_key``
        (as in Flower's ``FedAvg``).

    Other Parameters
    ----------------
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with its
        defaults. With fewer than ``K`` nodes connected a round goes on with
        the nodes there are, as every strategy does, and warns: without
        replacement each set is then every node. ``seed`` seeds the device
        draws, with the round
        (:func:`~flwr_importance.sampling.uniform_client_set`, not
        ``self.rng``); ``query_timeout`` bounds the wait for ``S2``'s
        gradients (two-set mode only).

    Raises
    ------
    ValueError
        For an unknown mode, weighting or option, ``K < 1``, a negative ``mu``
        or ``psi``, ``server_lr <= 0`` or a negative seed.

    Client contract
    ---------------
    ``train`` to each distinct device of ``S`` (``S1``): the global model
    ``w^t`` under ``arrayrecord_key`` and, under ``configrecord_key``,
    ``server-round``, the ``train_config`` and ``proximal-mu`` (FedProx's
    ``mu >= 0``, as Flower's ``FedProx`` sends it: the device adds
    ``(mu/2) ||w - w^t||^2`` to its loss). Reply: ArrayRecords ``update``
    (``w_k - w^t``, trained minus received) and ``gradient``
    (``g_k = grad F_k(w^t)``: the gradient of the mean local loss over all
    local data at the received model, before training), both keyed and
    shaped like the model (zeros for buffers) and neither scaled by
    ``n_k``; one MetricRecord with ``gamma`` (the inexactness
    ``||grad F_k(w_k) + mu (w_k - w^t)|| / ||g_k||``, 0 when ``g_k = 0``,
    ``>= 0``; values above 1 are clipped to 1, with a log line),
    ``num-examples`` (``n_k >= 0``, always required) and any other metrics
    (averaged, weighted by ``num-examples``).

    ``query.gradient`` (two-set mode), before the train messages, to each
    device of ``S2`` not in ``S1``: the same model and config as ``train``;
    no training. Reply: the ArrayRecord ``gradient`` (``g_j``, as above)
    and, with ``weighting="samples"``, the metric ``num-examples``. A
    device in both sets gets only the train message, whose gradient serves
    ``S2``.

    Replies that break the contract (error, NaN, wrong shapes, missing or
    negative metric) are logged and left out of the round. ``evaluate``: as
    Flower's ``FedAvg``.

    Handlers: :mod:`flwr_importance.clientapps.folb`.

    Notes
    -----
    The server learns each sampled device's full local gradient and update.
    """

    aggregates_train_metrics = True
    client_side = ClientSide(
        "reply `folb_reply(msg, model, gradient=local_gradient(...), "
        "gamma=inexactness(...), metrics=...)` from the train function "
        "(flwr_importance.clientapps.folb); mode='two-set' also needs "
        '`@app.query("gradient")` replying `gradient_reply(...)`',
        "docs/methods.md#2-folb-gradient-aligned-reweighting-of-fedprox-updates",
    )

    def __init__(
        self,
        *,
        clients_per_round: int,
        proximal_mu: float = 0.0,
        mode: Mode = "single-set",
        weighting: Weighting = "samples",
        replace: bool = False,
        server_lr: float = 1.0,
        psi: float = 0.0,
        penalty: Penalty = "norm-product",
        negative: NegativeRule = "flip",
        denominator: Denominator = "abs",
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        **options: Unpack[StrategyOptions],
    ) -> None:
        check_options(penalty, negative, denominator, psi)
        self.clients_per_round = check_count("clients_per_round", clients_per_round)
        if not proximal_mu >= 0:
            raise ValueError(f"proximal_mu must be >= 0, got {proximal_mu}")
        check_choice("mode", mode, Mode)
        check_choice("weighting", weighting, Weighting)
        if not isinstance(replace, bool):
            raise TypeError(f"replace must be True or False, got {replace!r}")
        self.server_lr = check_positive("server_lr", server_lr)
        super().__init__(train_metrics_aggr_fn=train_metrics_aggr_fn, **options)
        self.proximal_mu = proximal_mu
        self.mode: Mode = mode
        self.weighting: Weighting = weighting
        self.replace = replace
        self.psi = psi
        self.penalty: Penalty = penalty
        self.negative: NegativeRule = negative
        self.denominator: Denominator = denominator

    @property
    def last_draws(self) -> tuple[Counter[int], Counter[int]]:
        """The last round's multisets ``(S or S1, S2)`` as node id -> draws."""
        if self.plan is None:
            return Counter(), Counter()
        return Counter(self.plan.train_draws), Counter(self.plan.reference_draws)

    def unused_settings_now(self) -> frozenset[str]:
        """The shared settings unused: ``query_timeout`` in the single-set mode."""
        if self.mode == "single-set":
            return super().unused_settings_now() | {"query_timeout"}
        return super().unused_settings_now()

    def summary(self) -> None:
        """Log FOLB's settings, then the shared ones."""
        log_settings(
            "FOLB",
            {
                "Mode": self.mode,
                "Draws per set K": (
                    f"{self.clients_per_round} "
                    f"{'with' if self.replace else 'without'} replacement"
                ),
                "Weighting": self.weighting,
                "Server lr": self.server_lr,
                "Proximal mu": self.proximal_mu,
                "psi": f"{self.psi} (penalty {self.penalty})",
                "Negative scores": self.negative,
                "Denominator": self.denominator,
                "Train metrics weighted by": repr(self.weighted_by_key),
            },
        )
        super().summary()

    # -- configure ---------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Draw ``S`` (and ``S2``), query ``S2``'s gradients, send train messages."""
        node_ids = connected_nodes(grid, self.min_available_nodes)
        warn_if_fewer_nodes(
            len(node_ids),
            self.clients_per_round,
            "the multiset draws every node, most of them several times"
            if self.replace
            else "every node trains (each set draws all of them)",
        )
        config[protocol.SERVER_ROUND] = server_round
        config[protocol.PROXIMAL_MU] = self.proximal_mu
        train_draws = self._draw(node_ids, server_round, TRAIN_STREAM)
        reference_draws: Counter[int] = Counter()
        reference_gradients: dict[int, tuple[ArrayRecord, float]] = {}
        if self.mode == "two-set":
            reference_draws = self._draw(node_ids, server_round, REFERENCE_STREAM)
            reference_gradients = self._query_gradients(
                [node for node in reference_draws if node not in train_draws],
                arrays,
                config,
                grid,
            )
        self.keep_plan(
            FolbPlan(
                server_round=server_round,
                arrays=arrays,
                nodes=frozenset(train_draws),
                train_draws=train_draws,
                reference_draws=reference_draws,
                reference_gradients=reference_gradients,
            )
        )
        log(
            INFO,
            "configure_train: %d draws -> %d distinct nodes train (out of %d)",
            train_draws.total(),
            len(train_draws),
            len(node_ids),
        )
        return self.build_messages(
            dict.fromkeys(train_draws, config), MessageType.TRAIN, arrays
        )

    def _draw(
        self, node_ids: Sequence[int], server_round: int, stream: int
    ) -> Counter[int]:
        """``K`` uniform draws (a multiset with ``replace``), node id -> draws.

        Without replacement and with fewer than ``K`` nodes, every node once
        (:meth:`configure_train` warns).
        """
        draws = (
            self.clients_per_round
            if self.replace
            else min(self.clients_per_round, len(node_ids))
        )
        return Counter(
            uniform_client_set(
                node_ids,
                draws,
                seed=self.seed,
                server_round=server_round,
                replace=self.replace,
                stream=stream,
            )
        )

    def _query_gradients(
        self,
        node_ids: Sequence[int],
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
    ) -> dict[int, tuple[ArrayRecord, float]]:
        """``S2``'s gradients at ``arrays`` and ``n_j`` (1 if uniform), by node."""
        if not node_ids:
            return {}
        answers = self.query(
            grid, dict.fromkeys(node_ids, config), protocol.FOLB_GRADIENT_QUERY, arrays
        )
        checked = self.check_replies(
            answers.values(),
            nonnegative_keys=self._sample_keys,
            expected_arrays={protocol.FOLB_GRADIENT: arrays},
            context="query.gradient",
        )
        return {
            reply.node_id: (
                reply.arrays[protocol.FOLB_GRADIENT],
                self._sample_count(reply),
            )
            for reply in checked
        }

    @property
    def _sample_keys(self) -> tuple[str, ...]:
        """The metrics a reply must carry for this weighting."""
        return (protocol.NUM_EXAMPLES,) if self.weighting == "samples" else ()

    def _sample_count(self, reply: CheckedReply) -> float:
        """A reply's weight ``n_k`` (``weighting="samples"``), else 1."""
        return (
            reply.metrics[protocol.NUM_EXAMPLES] if self.weighting == "samples" else 1.0
        )

    # -- aggregate ---------------------------------------------------------------
    def aggregate_round(
        self, plan: FolbPlan, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """``w^t + sum_k a_k dw_k`` with FOLB's weights ``a_k`` (eq. 13, 9 or 18)."""
        usable = self.check_replies(
            replies,
            metric_keys=(protocol.FOLB_GAMMA,),
            nonnegative_keys=(
                protocol.FOLB_GAMMA,
                self.weighted_by_key,
                *self._sample_keys,
            ),
            expected_arrays={
                protocol.FOLB_UPDATE: plan.arrays,
                protocol.FOLB_GRADIENT: plan.arrays,
            },
            expected_nodes=plan.nodes,
        )
        if not usable:
            log(WARNING, "aggregate_train: no usable reply; model unchanged")
            return None, None
        result = self._weights(usable, plan)
        if result.fallback_reason is not None:
            log(
                WARNING,
                "aggregate_train: round %d falls back to the plain mean: %s",
                plan.server_round,
                result.fallback_reason,
            )
        # w^t + eta sum_k a_k dw_k, array by array, each read in place.
        new_arrays = self.release(
            plan.arrays,
            [reply.arrays[protocol.FOLB_UPDATE] for reply in usable],
            self.server_lr * result.weights,
        )
        metrics = self.train_metrics(usable)
        metrics[protocol.FOLB_FALLBACK] = int(result.fallback_reason is not None)
        metrics[protocol.FOLB_NEGATIVE_WEIGHTS] = int(np.sum(result.weights < 0))
        return new_arrays, metrics

    def _weights(self, usable: list[CheckedReply], draws: FolbPlan) -> FolbWeights:
        """FOLB's weights for the usable replies (multiplicities, ``n_k`` included)."""
        gradients = {
            reply.node_id: (
                reply.arrays[protocol.FOLB_GRADIENT],
                self._sample_count(reply),
            )
            for reply in usable
        }
        reference_gradients = None
        reference_counts = None
        reference_samples = None
        if self.mode == "two-set":
            # S2 devices that also trained answered with their train reply.
            available = {**draws.reference_gradients, **gradients}
            answered = [node for node in draws.reference_draws if node in available]
            if len(answered) < len(draws.reference_draws):
                log(
                    INFO,
                    "aggregate_train: %d of %d S2 nodes gave no gradient",
                    len(draws.reference_draws) - len(answered),
                    len(draws.reference_draws),
                )
            reference_gradients = [
                _split_gradient(available[node][0]) for node in answered
            ]
            reference_counts = [draws.reference_draws[node] for node in answered]
            reference_samples = [available[node][1] for node in answered]
        return folb_weights(
            [_split_gradient(record) for record, _ in gradients.values()],
            [draws.train_draws[reply.node_id] for reply in usable],
            mode=self.mode,
            sample_counts=[samples for _, samples in gradients.values()],
            reference_gradients=reference_gradients,
            reference_multiplicities=reference_counts,
            reference_sample_counts=reference_samples,
            inexactness=[_clipped_gamma(reply) for reply in usable],
            psi=self.psi,
            penalty=self.penalty,
            negative=self.negative,
            denominator=self.denominator,
        )


def _split_gradient(record: ArrayRecord) -> SplitVector:
    """The gradient in ``record`` as views of its arrays' bytes (no copy)."""
    return SplitVector(tuple(array_values(array) for array in record.values()))


def _clipped_gamma(reply: CheckedReply) -> float:
    """The reply's ``gamma_k`` clipped to ``[0, 1]`` (eq. 18 assumes that range)."""
    gamma = reply.metrics[protocol.FOLB_GAMMA]
    if gamma > 1.0:
        log(
            WARNING,
            "aggregate_train: node %d reported gamma %.4g > 1, clipped to 1",
            reply.node_id,
            gamma,
        )
    return min(gamma, 1.0)


METHOD = MethodSpec(
    name="folb",
    strategy=FOLB,
    client_handlers="flwr_importance.clientapps.folb:make_folb_handlers",
    legacy="flwr_importance.compat.folb:FOLB",
    central_dp_refusal=(
        "each of FOLB's weights a_k depends on every reply's gradient, so one "
        "client's reply moves every term of the step: no per-client bound"
    ),
)
