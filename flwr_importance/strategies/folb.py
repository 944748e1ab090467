"""FOLB: gradient-aligned aggregation of uniformly sampled FedProx updates."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Literal

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
from flwr_importance.aggregation.folb import (
    Denominator,
    FolbWeights,
    NegativeRule,
    Penalty,
    SplitVector,
    check_options,
    folb_weights,
)
from flwr_importance.protocol import (
    FOLB_GAMMA,
    FOLB_GRADIENT,
    FOLB_UPDATE,
)
from flwr_importance.strategies.common import (
    CheckedFedAvg,
    CheckedReply,
    array_values,
    check_replies,
    combine_arrays,
    connected_nodes,
    node_messages,
    send_query,
)

Mode = Literal["single-set", "two-set"]
MODES: tuple[Mode, ...] = ("single-set", "two-set")


@dataclass
class _RoundDraws:
    """What ``configure_train`` decided, for ``aggregate_train`` of that round."""

    server_round: int
    arrays: ArrayRecord
    train_draws: Counter[int]
    reference_draws: Counter[int] = field(default_factory=Counter)
    reference_gradients: dict[int, ArrayRecord] = field(default_factory=dict)


class FOLB(CheckedFedAvg):
    """FOLB (Nguyen et al., "Fast-convergent federated learning", IEEE JSAC 2021).

    Each round the server draws ``K`` devices uniformly *with replacement* (a
    multiset, as in the paper), they run FedProx local training and return their
    update ``dw_k = w_k - w^t`` and their full local gradient ``g_k`` at the
    received model. Instead of averaging, the server weighs each update by how
    well its gradient aligns with the estimated global gradient
    (``FOLB-EQUATIONS.md``):

    - single-set (default, eq. 13): ``gS = mean_{j in S} g_j``,
      ``c_k = <g_k, gS>``, ``w^{t+1} = w^t + sum_k c_k / sum_i |c_i| dw_k``;
      a device with ``c_k < 0`` has its update subtracted;
    - two-set (eqs. 9-10): a second independent multiset ``S2`` of ``K`` devices
      only computes ``g_j`` (a ``query.gradient`` message, no training) and
      ``gS2`` replaces ``gS``;
    - heterogeneity-aware (eq. 18, ``psi > 0``, either mode):
      ``d_k = c_k - psi gamma_k ||g_k|| ||gS||`` replaces ``c_k``, with the
      devices' reported inexactness ``gamma_k``.

    Degenerate rounds (all inner products zero, a single device, a non-finite
    gradient, no answer from ``S2``) use the plain mean of the valid updates,
    with a warning.

    **Decision** (multisets): a device drawn ``m`` times trains once (its local
    randomness is seeded by node and round, so a second run would give the same
    reply) and counts ``m`` times in every sum, as the paper's Algorithm 1 says
    ("this aggregation effectively places a larger weight on" it). In the
    two-set mode a device drawn in both sets is sent only the train message; the
    gradient in its train reply serves ``S2`` too (it is the same ``g_k``).

    Parameters
    ----------
    clients_per_round : int
        ``K``, the number of uniform draws per set and round.
    proximal_mu : float
        FedProx ``mu`` sent to the clients (``proximal-mu``), as Flower's
        ``FedProx`` does.
    mode : {"single-set", "two-set"}
        Eq. 13 or eqs. 9-10.
    psi : float
        Heterogeneity weight of eq. 18; 0 (default) is eq. 13/9.
    penalty : {"norm-product", "global-norm"}
        ``psi gamma_k ||g_k|| ||gS||`` (default) or ``psi gamma_k ||gS||^2``.
    negative : {"flip", "drop"}
        Devices with a negative score: update subtracted (default) or dropped.
    denominator : {"abs", "signed"}
        ``sum_i |c_i|`` (default) or ``sum_i c_i``.
    seed : int
        Seeds the server's sampling (``numpy.random.default_rng``).
    query_timeout : float
        Seconds to wait for ``S2``'s gradients.
    fraction_evaluate, min_evaluate_nodes, min_available_nodes, arrayrecord_key,
    configrecord_key, train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in Flower's ``FedAvg`` (``min_available_nodes``: a round with fewer
        connected nodes is skipped).

    Client contract
    ---------------
    ``train`` to each distinct device of ``S`` (``S1``): ArrayRecord
    ``arrays`` (the global model), ConfigRecord ``config`` with
    ``server-round`` and ``proximal-mu``. Reply: ArrayRecords ``"update"``
    (``w_k - w^t``) and ``"gradient"`` (``grad F_k(w^t)``, full local gradient
    before training), both keyed and shaped like the model; one MetricRecord
    with ``gamma`` (in ``[0, 1]``; larger values are clipped with a log line),
    ``num-examples`` (>= 0, weighs the train metrics only) and any other
    metrics (averaged).

    ``query.gradient`` (two-set mode) to each device of ``S2`` not in ``S1``:
    same ``arrays`` and ``config``. Reply: ArrayRecord ``"gradient"``.

    Replies that break the contract (error, NaN, wrong shapes, missing or
    negative metric) are logged and left out of the round.

    The server learns each sampled device's full local gradient and update.
    """

    def __init__(
        self,
        clients_per_round: int = 10,
        proximal_mu: float = 0.0,
        mode: Mode = "single-set",
        psi: float = 0.0,
        penalty: Penalty = "norm-product",
        negative: NegativeRule = "flip",
        denominator: Denominator = "abs",
        seed: int = 0,
        query_timeout: float = 600.0,
        fraction_evaluate: float = 1.0,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: (
            Callable[[list[RecordDict], str], MetricRecord] | None
        ) = None,
        evaluate_metrics_aggr_fn: (
            Callable[[list[RecordDict], str], MetricRecord] | None
        ) = None,
    ) -> None:
        check_options(penalty, negative, denominator, psi)
        if clients_per_round < 1:
            raise ValueError(f"clients_per_round must be >= 1, got {clients_per_round}")
        if not proximal_mu >= 0:
            raise ValueError(f"proximal_mu must be >= 0, got {proximal_mu}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        super().__init__(
            fraction_evaluate=fraction_evaluate,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key="num-examples",
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        self.clients_per_round = clients_per_round
        self.proximal_mu = proximal_mu
        self.mode: Mode = mode
        self.psi = psi
        self.penalty: Penalty = penalty
        self.negative: NegativeRule = negative
        self.denominator: Denominator = denominator
        self.seed = seed
        self.query_timeout = query_timeout
        self._rng = np.random.default_rng(seed)
        self._round: _RoundDraws | None = None

    @property
    def last_draws(self) -> tuple[Counter[int], Counter[int]]:
        """The last round's multisets ``(S or S1, S2)`` as node id -> draws."""
        if self._round is None:
            return Counter(), Counter()
        return Counter(self._round.train_draws), Counter(self._round.reference_draws)

    def summary(self) -> None:
        """Log FOLB's settings."""
        log(INFO, "\t├──> FOLB settings:")
        log(INFO, "\t│\t├── Mode: %s, K = %d draws", self.mode, self.clients_per_round)
        log(INFO, "\t│\t├── Proximal mu: %s", self.proximal_mu)
        log(INFO, "\t│\t├── psi: %s (penalty %s)", self.psi, self.penalty)
        log(
            INFO,
            "\t│\t├── Negative scores: %s, denominator: %s",
            self.negative,
            self.denominator,
        )
        log(INFO, "\t│\t└── Seed: %d", self.seed)
        log(
            INFO,
            "\t└──> Evaluate: fraction %.2f, min nodes %d, min available %d",
            self.fraction_evaluate,
            self.min_evaluate_nodes,
            self.min_available_nodes,
        )

    # -- configure ---------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Draw ``S`` (and ``S2``), query ``S2``'s gradients, send train messages."""
        self._round = None
        node_ids = connected_nodes(grid, self.min_available_nodes)
        config["server-round"] = server_round
        config["proximal-mu"] = self.proximal_mu
        draws = _RoundDraws(server_round, arrays, self._draw(node_ids))
        if self.mode == "two-set":
            draws.reference_draws = self._draw(node_ids)
            draws.reference_gradients = self._query_gradients(
                [
                    node
                    for node in draws.reference_draws
                    if node not in draws.train_draws
                ],
                arrays,
                config,
                grid,
            )
        self._round = draws
        log(
            INFO,
            "configure_train: %d draws -> %d distinct nodes train (out of %d)",
            self.clients_per_round,
            len(draws.train_draws),
            len(node_ids),
        )
        return node_messages(
            dict.fromkeys(draws.train_draws, config),
            MessageType.TRAIN,
            arrays,
            self.arrayrecord_key,
            self.configrecord_key,
        )

    def _draw(self, node_ids: Sequence[int]) -> Counter[int]:
        """``K`` uniform draws with replacement (the paper's multiset)."""
        picks = self._rng.choice(len(node_ids), size=self.clients_per_round)
        return Counter(int(node_ids[index]) for index in picks)

    def _query_gradients(
        self,
        node_ids: Sequence[int],
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
    ) -> dict[int, ArrayRecord]:
        """``S2``'s gradients at ``arrays`` via ``query.gradient``, by node id."""
        if not node_ids:
            return {}
        answers = send_query(
            grid,
            dict.fromkeys(node_ids, config),
            "gradient",
            arrays,
            self.query_timeout,
        )
        checked = check_replies(
            answers.values(),
            expected_arrays={FOLB_GRADIENT: arrays},
            context="query.gradient",
        )
        return {reply.node_id: reply.arrays[FOLB_GRADIENT] for reply in checked}

    # -- aggregate ---------------------------------------------------------------
    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """``w^t + sum_k a_k dw_k`` with FOLB's weights ``a_k`` (eq. 13, 9 or 18)."""
        draws = self._round
        if draws is None or draws.server_round != server_round:
            log(WARNING, "aggregate_train: round %d was not configured", server_round)
            return None, None
        usable = self._usable_replies(replies, draws)
        if not usable:
            log(WARNING, "aggregate_train: no usable reply; model unchanged")
            return None, None
        result = self._weights(usable, draws)
        if result.fallback_reason is not None:
            log(
                WARNING,
                "aggregate_train: round %d falls back to the plain mean: %s",
                server_round,
                result.fallback_reason,
            )
        # w^t + sum_k a_k dw_k, array by array, each read in place.
        new_arrays = combine_arrays(
            [draws.arrays, *(reply.arrays[FOLB_UPDATE] for reply in usable)],
            lambda arrays: arrays[0] + weighted_sum(arrays[1:], result.weights),
            draws.arrays,
        )
        metrics = self.train_metrics_aggr_fn(
            [_metric_content(reply) for reply in usable],
            self.weighted_by_key,
        )
        metrics["folb-fallback"] = int(result.fallback_reason is not None)
        metrics["folb-negative-weights"] = int(np.sum(result.weights < 0))
        return new_arrays, metrics

    def _usable_replies(
        self, replies: Iterable[Message], draws: _RoundDraws
    ) -> list[CheckedReply]:
        """Checked replies from nodes of this round's ``S``."""
        checked = check_replies(
            replies,
            metric_keys=(FOLB_GAMMA,),
            nonnegative_keys=(FOLB_GAMMA, self.weighted_by_key),
            expected_arrays={FOLB_UPDATE: draws.arrays, FOLB_GRADIENT: draws.arrays},
        )
        usable = []
        for reply in checked:
            if reply.node_id in draws.train_draws:
                usable.append(reply)
            else:
                log(WARNING, "aggregate_train: node %d was not sampled", reply.node_id)
        return usable

    def _weights(self, usable: list[CheckedReply], draws: _RoundDraws) -> FolbWeights:
        """FOLB's weights for the usable replies (multiplicities included)."""
        gradients = {reply.node_id: reply.arrays[FOLB_GRADIENT] for reply in usable}
        reference_gradients = None
        reference_counts = None
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
                _split_gradient(available[node]) for node in answered
            ]
            reference_counts = [draws.reference_draws[node] for node in answered]
        return folb_weights(
            [_split_gradient(record) for record in gradients.values()],
            [draws.train_draws[reply.node_id] for reply in usable],
            reference_gradients=reference_gradients,
            reference_multiplicities=reference_counts,
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
    gamma = reply.metrics[FOLB_GAMMA]
    if gamma > 1.0:
        log(
            WARNING,
            "aggregate_train: node %d reported gamma %.4g > 1, clipped to 1",
            reply.node_id,
            gamma,
        )
    return min(gamma, 1.0)


def _metric_content(reply: CheckedReply) -> RecordDict:
    """The reply's metrics as the content Flower's metric aggregators read."""
    metrics: dict[str, int | float | list[int] | list[float]] = dict(reply.metrics)
    return RecordDict({"metrics": MetricRecord(metrics)})
