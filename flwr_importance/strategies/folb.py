"""FOLB: gradient-aligned aggregation of uniformly sampled FedProx updates.

Nguyen et al., "Fast-convergent federated learning", IEEE JSAC 2021.
"""

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
    FOLB_FALLBACK,
    FOLB_GAMMA,
    FOLB_GRADIENT,
    FOLB_GRADIENT_QUERY,
    FOLB_NEGATIVE_WEIGHTS,
    FOLB_UPDATE,
    NUM_EXAMPLES,
    PROXIMAL_MU,
    SERVER_ROUND,
)
from flwr_importance.registry import CannedVariant, MethodSpec
from flwr_importance.sampling import uniform_client_set
from flwr_importance.strategies.common import (
    CheckedFedAvg,
    CheckedReply,
    array_values,
    check_replies,
    combine_arrays,
    connected_nodes,
    node_messages,
    send_query,
    warn_if_fewer_nodes,
)

Mode = Literal["single-set", "two-set"]
MODES: tuple[Mode, ...] = ("single-set", "two-set")
Weighting = Literal["samples", "uniform"]
WEIGHTINGS: tuple[Weighting, ...] = ("samples", "uniform")

#: ``uniform_client_set`` streams: ``S`` (``S1``), shared with the baselines of a
#: comparison, and FOLB's own second set ``S2``.
TRAIN_STREAM = 0
REFERENCE_STREAM = 1


@dataclass
class _RoundDraws:
    """What ``configure_train`` decided, for ``aggregate_train`` of that round."""

    server_round: int
    arrays: ArrayRecord
    train_draws: Counter[int]
    reference_draws: Counter[int] = field(default_factory=Counter)
    #: ``S2`` nodes that only answered ``query.gradient``: gradient, ``n_j``.
    reference_gradients: dict[int, tuple[ArrayRecord, float]] = field(
        default_factory=dict
    )


class FOLB(CheckedFedAvg):
    """FOLB (Nguyen et al., "Fast-convergent federated learning", IEEE JSAC 2021).

    Each round the server draws ``K`` devices uniformly, they run FedProx local
    training and return their update ``dw_k = w_k - w^t``, their full local
    gradient ``g_k`` at the received model and their sample count ``n_k``.
    Instead of averaging, the server weighs each update by how well its
    gradient aligns with the estimated global gradient of the sample-weighted
    objective ``f = sum_k (n_k / n) F_k``, the one the paper optimizes (Sec.
    II-A, "the approach we take throughout this paper"):

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

    ``weighting="uniform"`` drops every ``n_k`` (the ``1/N`` objective).
    Degenerate rounds (all inner products zero, a single device, a non-finite
    gradient, no answer from ``S2``) use the ``n_k``-weighted (or plain) mean
    of the valid updates, with a warning.

    **Device draws.** The paper's analysis samples with replacement (Sec. III;
    Algorithms 1 and 2 draw multisets); FedProx's code, the paper's code base
    and baseline, draws ``K`` distinct devices. The default is without
    replacement, so that FOLB trains the same number of devices as FedProx
    and, through :func:`flwr_importance.sampling.uniform_client_set` (a pure
    function of seed, round and the sorted node ids), the *same* devices as a
    FedProx or FedAvg baseline given the same seed: the aggregation is then
    the only difference. With ``replace=True`` a device drawn ``m`` times
    trains once (its local randomness is seeded by node and round, so a second
    run would give the same reply) and counts ``m`` times in every sum, as
    Algorithm 1 says ("this aggregation effectively places a larger weight
    on" it). In the two-set mode a device drawn in both sets is sent only the
    train message; the gradient in its train reply serves ``S2`` too.

    **Server step scale (open question).** With ``eta = 1`` the weights'
    absolute values sum to 1, so FOLB's step has FedProx's scale and only
    re-weights the same updates. The paper's text hints at a larger step
    (vanilla FOLB "fluctuates widely even in later iterations"; Prop. 2 calls
    the single-set bound some factor "times better"), but the factor is lost
    in the available text. ``server_lr`` (``eta``) is left at 1 and exposed;
    tune it, if at all, for every compared method alike.

    Parameters
    ----------
    clients_per_round : int
        ``K``, the number of uniform draws per set and round.
    proximal_mu : float
        FedProx ``mu`` sent to the clients (``proximal-mu``), as Flower's
        ``FedProx`` does.
    mode : {"single-set", "two-set"}
        Eq. 13 or eqs. 9-10.
    weighting : {"samples", "uniform"}
        Weigh devices by their reported ``num-examples`` (default, the paper's
        objective) or all alike.
    replace : bool
        Draw with replacement (the paper's analysis) or ``K`` distinct devices
        (default, as FedProx's code).
    server_lr : float
        ``eta > 0``, the factor on the aggregated update (default 1).
    psi : float
        Heterogeneity weight of eq. 18; 0 (default) is eq. 13/9.
    penalty : {"norm-product", "global-norm"}
        ``psi gamma_k ||g_k|| ||gS||`` (default) or ``psi gamma_k ||gS||^2``.
    negative : {"flip", "drop"}
        Devices with a negative score: update subtracted (default) or dropped.
    denominator : {"abs", "signed"}
        ``sum_i n_i |c_i|`` (default) or ``sum_i n_i c_i``.
    seed : int
        Seeds the device draws (>= 0), with the round.
    query_timeout : float
        Seconds to wait for ``S2``'s gradients.
    min_available_nodes : int, optional
        A round waits for this many connected nodes; default ``K``. Without
        replacement it must be at least ``K``.
    fraction_evaluate, min_evaluate_nodes, arrayrecord_key, configrecord_key,
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in Flower's ``FedAvg``.

    Raises
    ------
    ValueError
        For an unknown mode, weighting or option, ``K < 1``, a negative ``mu``
        or ``psi``, ``server_lr <= 0``, a negative seed, or
        ``min_available_nodes < K`` without replacement (a round could not
        draw ``K`` distinct devices).

    Client contract
    ---------------
    ``train`` to each distinct device of ``S`` (``S1``): ArrayRecord
    ``arrays`` (the global model), ConfigRecord ``config`` with
    ``server-round`` and ``proximal-mu``. Reply: ArrayRecords ``"update"``
    (``w_k - w^t``) and ``"gradient"`` (``grad F_k(w^t)``, full local gradient
    before training), both keyed and shaped like the model; one MetricRecord
    with ``gamma`` (in ``[0, 1]``; larger values are clipped with a log line),
    ``num-examples`` (``n_k >= 0``) and any other metrics (averaged).

    ``query.gradient`` (two-set mode) to each device of ``S2`` not in ``S1``:
    same ``arrays`` and ``config``. Reply: ArrayRecord ``"gradient"`` and, with
    ``weighting="samples"``, the metric ``num-examples``.

    Replies that break the contract (error, NaN, wrong shapes, missing or
    negative metric) are logged and left out of the round.

    The server learns each sampled device's full local gradient and update.
    """

    def __init__(
        self,
        *,
        clients_per_round: int = 10,
        proximal_mu: float = 0.0,
        mode: Mode = "single-set",
        weighting: Weighting = "samples",
        replace: bool = False,
        server_lr: float = 1.0,
        psi: float = 0.0,
        penalty: Penalty = "norm-product",
        negative: NegativeRule = "flip",
        denominator: Denominator = "abs",
        seed: int = 0,
        query_timeout: float = 600.0,
        min_available_nodes: int | None = None,
        fraction_evaluate: float = 1.0,
        min_evaluate_nodes: int = 2,
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
        if weighting not in WEIGHTINGS:
            raise ValueError(
                f"weighting must be one of {WEIGHTINGS}, got {weighting!r}"
            )
        if not isinstance(replace, bool):
            raise ValueError(f"replace must be True or False, got {replace!r}")
        if not (np.isfinite(server_lr) and server_lr > 0):
            raise ValueError(f"server_lr must be finite and > 0, got {server_lr}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if min_available_nodes is None:
            min_available_nodes = clients_per_round
        if not replace and min_available_nodes < clients_per_round:
            raise ValueError(
                f"without replacement a round draws {clients_per_round} distinct "
                f"nodes, but min_available_nodes = {min_available_nodes} lets it "
                "start with fewer; raise min_available_nodes or set replace=True"
            )
        super().__init__(
            fraction_evaluate=fraction_evaluate,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=NUM_EXAMPLES,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        self.clients_per_round = clients_per_round
        self.proximal_mu = proximal_mu
        self.mode: Mode = mode
        self.weighting: Weighting = weighting
        self.replace = replace
        self.server_lr = server_lr
        self.psi = psi
        self.penalty: Penalty = penalty
        self.negative: NegativeRule = negative
        self.denominator: Denominator = denominator
        self.seed = seed
        self.query_timeout = query_timeout
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
        log(
            INFO,
            "\t│\t├── Mode: %s, K = %d draws %s replacement",
            self.mode,
            self.clients_per_round,
            "with" if self.replace else "without",
        )
        log(
            INFO,
            "\t│\t├── Weighting: %s, server lr: %s",
            self.weighting,
            self.server_lr,
        )
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
        if self.replace:  # without replacement, min_available_nodes >= K waits
            warn_if_fewer_nodes(
                len(node_ids),
                self.clients_per_round,
                "the multiset draws every node, most of them several times",
            )
        config[SERVER_ROUND] = server_round
        config[PROXIMAL_MU] = self.proximal_mu
        draws = _RoundDraws(
            server_round, arrays, self._draw(node_ids, server_round, TRAIN_STREAM)
        )
        if self.mode == "two-set":
            draws.reference_draws = self._draw(node_ids, server_round, REFERENCE_STREAM)
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

    def _draw(
        self, node_ids: Sequence[int], server_round: int, stream: int
    ) -> Counter[int]:
        """``K`` uniform draws (a multiset with ``replace``), node id -> draws."""
        return Counter(
            uniform_client_set(
                node_ids,
                self.clients_per_round,
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
        answers = send_query(
            grid,
            dict.fromkeys(node_ids, config),
            FOLB_GRADIENT_QUERY,
            arrays,
            self.query_timeout,
        )
        checked = check_replies(
            answers.values(),
            nonnegative_keys=self._sample_keys,
            expected_arrays={FOLB_GRADIENT: arrays},
            context="query.gradient",
        )
        return {
            reply.node_id: (reply.arrays[FOLB_GRADIENT], self._sample_count(reply))
            for reply in checked
        }

    @property
    def _sample_keys(self) -> tuple[str, ...]:
        """The metrics a reply must carry for this weighting."""
        return (NUM_EXAMPLES,) if self.weighting == "samples" else ()

    def _sample_count(self, reply: CheckedReply) -> float:
        """A reply's weight ``n_k`` (``weighting="samples"``), else 1."""
        return reply.metrics[NUM_EXAMPLES] if self.weighting == "samples" else 1.0

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
        # w^t + eta sum_k a_k dw_k, array by array, each read in place.
        step_weights = self.server_lr * result.weights
        new_arrays = combine_arrays(
            [draws.arrays, *(reply.arrays[FOLB_UPDATE] for reply in usable)],
            lambda arrays: arrays[0] + weighted_sum(arrays[1:], step_weights),
            draws.arrays,
        )
        metrics = self.train_metrics_aggr_fn(
            [_metric_content(reply) for reply in usable],
            self.weighted_by_key,
        )
        metrics[FOLB_FALLBACK] = int(result.fallback_reason is not None)
        metrics[FOLB_NEGATIVE_WEIGHTS] = int(np.sum(result.weights < 0))
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
        """FOLB's weights for the usable replies (multiplicities, ``n_k`` included)."""
        gradients = {
            reply.node_id: (reply.arrays[FOLB_GRADIENT], self._sample_count(reply))
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


METHOD = MethodSpec(
    name="folb",
    strategy=FOLB,
    paper="Nguyen, Sehwag, Hosseinalipour, Brinton, Chiang, Poor, IEEE JSAC 2021",
    client_handlers="flwr_importance.clientapps.folb:make_folb_handlers",
    headline_preset="folb-synthetic-1-1",
    canned=(
        CannedVariant(
            name="folb",
            label="FOLB",
            arguments=lambda setup: {
                "clients_per_round": setup.clients_per_round,
                "proximal_mu": 0.01,
                "fraction_evaluate": 0.0,
                "min_available_nodes": setup.clients_per_round,
            },
            replies={"train": "folb-train"},
            # Two-set FOLB's gradient set costs about m more nodes' work.
            baseline="fedavg-2m",
        ),
    ),
    equal_work=lambda work: {"proximal-mu": 0.01},
    # The digits run is the short one; IID so that two rounds improve.
    smoke_preset="folb-digits",
    smoke={"partitioning": "iid", "local-lr": 0.2},
    legacy="flwr_importance.compat.folb:FOLB",
    benchmark="folb",
    benchmark_title="FOLB vs FedProx and FedAvg (Nguyen et al., JSAC 2021, Table I)",
)
