"""FedSampling: uniform data sampling with locally private client sizes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_importance import protocol
from flwr_importance.method_spec import MethodSpec
from flwr_importance.sampling.fedsampling import (
    binomial_upper_tail,
    epsilon_for_usable_estimate,
    nodes_for_usable_estimate,
    size_estimate_noise,
)
from flwr_importance.sampling.ledger import (
    DEFAULT_DELTA_PRIME,
    NodeReport,
    PrivacyLedger,
)
from flwr_importance.sampling.privacy import estimate_total_size, ldp_alpha
from flwr_importance.strategies.base import ImportanceStrategy, RoundPlan, log_settings
from flwr_importance.strategies.messages import connected_nodes
from flwr_importance.strategies.replies import ClientSide
from flwr_importance.validation import check_count, check_positive

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from flwr_importance.strategies.base import StrategyOptions

#: How unlikely the round's count of top-of-range size replies must be, were
#: every node below ``M - 1`` samples, before the server warns that
#: ``max_size`` clips the sizes (about one false warning in 1,000 rounds).
CLIPPING_SIGNIFICANCE = 1e-3

#: Why FedSampling refuses federated evaluation (also the legacy API's reason).
NO_FEDERATED_EVALUATION = (
    "FedSampling has no federated evaluation by design: Flower weights evaluate "
    "replies by num-examples, which reveals each node's size, the very thing its "
    "randomized size replies keep private; evaluate on the server instead "
    "(strategy.start(..., evaluate_fn=...) on the Message API, evaluate_fn=... on "
    "the legacy API) and leave fraction_evaluate at 0"
)


@dataclass(frozen=True, kw_only=True)
class SizeEstimatePlan(RoundPlan):
    """A round's size estimate: ``N_tilde`` (clamped to ``K``), raw, and its replies."""

    estimated_total_size: float
    raw_estimate: float
    num_size_replies: int


def node_report(metrics: Mapping[str, object]) -> NodeReport | None:
    """The node's own ledger in its size reply, if it sent a well-formed one."""
    values = [
        metrics.get(key)
        for key in (
            protocol.FEDSAMPLING_NODE_ANSWERS,
            protocol.FEDSAMPLING_NODE_EPSILON,
            protocol.FEDSAMPLING_NODE_REPRODUCIBLE_COINS,
        )
    ]
    if not all(
        isinstance(value, (int, float)) and math.isfinite(value) for value in values
    ):
        return None
    answers, epsilon_spent, reproducible = (float(v) for v in values)  # type: ignore[arg-type]
    return NodeReport(
        answers=int(answers),
        epsilon_spent=epsilon_spent,
        reproducible_coins=reproducible != 0,
    )


class FedSampling(ImportanceStrategy[SizeEstimatePlan]):
    """FedSampling, uniform data sampling with locally private client sizes.

    Implementation based on https://arxiv.org/abs/2306.14245

    Instead of sampling clients, every available node keeps each of its samples
    with the same probability ``K / N_tilde``, so a round uses ``K N / N_tilde``
    samples in expectation (``N`` the nodes' total size), drawn uniformly from
    the pooled data, as centralized SGD would. The server never learns a
    node's size: it estimates the total ``N_tilde`` from randomized-response
    replies (eps-local differential privacy). The estimate is of the total of
    the sizes clipped to ``M - 1``, ``N_clip <= N``, so a round keeps about
    ``K`` samples when ``max_size`` is above every node's size, and about
    ``K N / N_clip`` (more than ``K``) when it clips sizes (Notes).

    Each round, from inside ``configure_train``:

    1. ``query.sizes`` to every available node; each answers ``r_c`` in
       ``{1..M-1}`` by randomized response (eq. 1). Replies that are missing,
       not integers or out of range are logged and left out.
    2. ``N_tilde = (sum_c r_c - (1 - alpha) M |C| / 2) / alpha`` (eq. 2),
       clamped to at least ``K`` (logged).
    3. ``train`` to the nodes that answered.

    ``aggregate_train`` then applies ``Theta <- Theta - eta sum_c G_c`` to the
    model sent in step 3; a missing or malformed ``G_c`` is left out (logged).
    See docs/methods.md, section "3. FedSampling: uniform data sampling with
    private sizes", for the equations and the decisions.

    Parameters
    ----------
    samples_per_round : int
        ``K``, the expected number of samples per round when ``max_size`` is
        above every node's size (paper: 2048).
    max_size : int (default: 100)
        Size threshold ``M``: replies lie in ``{1..M-1}``, and the estimate is
        of the total of sizes clipped to ``M - 1`` (paper default 100).
    epsilon : float (default: 3.0)
        Local differential privacy budget of one size reply (paper default 3).
    delta_prime : float (default: 1e-6)
        ``delta'`` of the privacy ledger's advanced composition column, in
        ``(0, 1)`` (Notes).
    server_lr : float (default: 1.0)
        ``eta``; ``sum_c G_c`` estimates the mean gradient over ``K`` samples,
        so ``eta`` plays the role of a centralized SGD step size.
    local_steps : int (default: 1)
        Extension, not in the paper: ``E`` local gradient steps per node on
        its kept samples, replied as their sum ``(|S_c| / K)(w_0 - w_E) / lr``
        (:func:`~flwr_importance.clientapps.fedsampling.fedsampling_gradient`);
        with ``server_lr`` equal to the nodes' ``lr``, a round moves the model
        to the mean of the nodes' local models weighted by ``|S_c| / K``.

    Other Parameters
    ----------------
    **options
        The shared settings of
        :class:`~flwr_importance.strategies.base.ImportanceStrategy`, with its
        defaults except ``fraction_evaluate``: 0.0, and any other value is
        refused, as there is no federated evaluation by design (Flower's
        ``FedAvg`` weights evaluation replies by ``num-examples``, which
        reveals the sizes); evaluate on the server with ``evaluate_fn``.
        ``query_timeout`` bounds the wait for the size replies; ``seed`` does
        not apply (the server draws nothing, each node keeps its samples at
        random).

    Client contract
    ---------------
    - ``query.sizes`` every round to every connected node, no model; config
      ``max-size`` (int ``M``), ``epsilon`` (float, the local differential
      privacy budget of this reply) and ``server-round`` (no
      ``train_config``). Reply: one MetricRecord with ``size-response``, the
      randomized response of eq. 1, an integer in ``{1..M-1}``: the true
      size clipped to ``M - 1`` with probability
      ``alpha = (e^eps - 1) / (e^eps + M - 2)``, else uniform on
      ``{1..M-1}``; never ``num-examples``. Optional: the node's own ledger,
      ``node-size-answers``, ``node-epsilon-spent`` and
      ``node-reproducible-coins`` (the helpers send it; the server records
      it in ``self.privacy_ledger``).
    - ``train`` to the nodes whose size reply was usable: the model under
      ``arrayrecord_key`` and config ``server-round``, the ``train_config``,
      ``samples-per-round`` (``K``), ``estimated-total-size``
      (``N_tilde >= K``) and ``local-steps`` (``E >= 1``). The node keeps
      each of its samples independently with probability ``K / N_tilde``.
      Reply: one ArrayRecord (any name) with the model's keys and shapes
      holding ``G_c = (1/K) sum_{s in S_c} g_s``, the per-sample loss
      gradients at the received model summed over the kept samples and
      divided by the public ``K``, never by the number kept (zeros if none
      was kept). With ``E > 1`` the node takes ``E`` full-batch steps
      ``w <- w - lr g(w)`` on its kept samples with its own ``lr`` (``g`` the
      mean gradient over them) and sends the sum of the ``E`` normalized
      gradients, ``G_c = (|S_c| / K)(w_0 - w_E) / lr``. No MetricRecord is
      needed; the reply must not carry ``num-examples`` or any count of
      kept samples.
    - No ``evaluate`` message: evaluate centrally (``evaluate_fn``).

    Handlers: :mod:`flwr_importance.clientapps.fedsampling`.

    Notes
    -----
    Requirements (checked and logged each round, since only the randomized
    replies reach the server): ``max_size`` above the largest partition,
    else those nodes count as ``M - 1`` and rounds keep more than ``K``
    samples (warned when too many replies sit at ``M - 1``); enough nodes
    for the epsilon, since the noise of ``N_tilde`` is about
    ``sqrt(C) M / alpha`` (:func:`~flwr_importance.sampling.size_estimate_noise`)
    against a total of at most ``C (M - 1)``:
    :func:`~flwr_importance.sampling.nodes_for_usable_estimate` gives the nodes
    holding at least ``M - 1`` samples each that a usable estimate needs.
    An estimate below ``K`` is logged with the nodes and the epsilon that
    would make it usable.

    Round metrics (``aggregate_train``): ``estimated-total-size`` (the
    clamped ``N_tilde`` used), ``raw-size-estimate``, ``ldp-alpha``,
    ``num-size-replies``, ``num-updates``.

    Privacy ledger: every reply is a fresh eps-LDP answer, so a node's privacy
    loss grows with the size queries it answers. ``self.privacy_ledger``
    (:class:`~flwr_importance.sampling.PrivacyLedger`) counts them per node
    (a malformed reply counts, the node did answer) and gives, per round, each
    node's ``k eps`` (basic composition) and the advanced composition bound at
    ``delta_prime``; the simulation app writes it into ``history.json``.
    """

    no_federated_evaluation = NO_FEDERATED_EVALUATION
    unused_settings = frozenset({"seed"})
    round_size = (
        "it keeps about samples_per_round samples per round, drawn from every "
        "node's data; pass samples_per_round=..."
    )
    client_side = ClientSide(
        "add `add_private_size_query(app, num_examples=...)` and reply "
        "`fedsampling_reply(msg, fedsampling_gradient(...))` from the train "
        "function (flwr_importance.clientapps.fedsampling)",
        "docs/methods.md#3-fedsampling-uniform-data-sampling-with-private-sizes",
    )

    def __init__(
        self,
        *,
        samples_per_round: int,
        max_size: int = 100,
        epsilon: float = 3.0,
        delta_prime: float = DEFAULT_DELTA_PRIME,
        server_lr: float = 1.0,
        local_steps: int = 1,
        **options: Unpack[StrategyOptions],
    ) -> None:
        self.samples_per_round = check_count("samples_per_round", samples_per_round)
        self.server_lr = check_positive("server_lr", server_lr)
        self.local_steps = check_count("local_steps", local_steps)
        super().__init__(**options)
        self.max_size = max_size
        self.epsilon = epsilon
        # Also validates max_size and epsilon, with the reason.
        self.alpha = ldp_alpha(epsilon, max_size)
        self.privacy_ledger = PrivacyLedger(epsilon=epsilon, delta_prime=delta_prime)

    def summary(self) -> None:
        """Log FedSampling's parameters, then the shared ones."""
        log_settings(
            "FedSampling",
            {
                "Samples per round K": self.samples_per_round,
                "Size threshold M": self.max_size,
                "epsilon (alpha)": f"{self.epsilon:g} ({self.alpha:.4f})",
                "Server learning rate": f"{self.server_lr:g}",
                "Local steps": self.local_steps,
                "Privacy ledger delta'": self._ledger_setting(),
            },
        )
        super().summary()

    def _ledger_setting(self) -> str:
        """``delta'``, and from how many answers its column improves on ``k eps``."""
        ledger = self.privacy_ledger
        crossover = (
            "never below k eps at this epsilon"
            if ledger.advanced_from is None
            else f"below k eps from k={ledger.advanced_from}"
        )
        return f"{ledger.delta_prime:g} (advanced composition {crossover})"

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Query private sizes, estimate ``N_tilde``, send the model to responders."""
        available = connected_nodes(grid, self.min_available_nodes)
        responses = self._size_responses(server_round, available, grid)
        if not responses:
            log(WARNING, "configure_train: no usable size reply; round skipped")
            return []
        raw_estimate = estimate_total_size(
            list(responses.values()), self.max_size, self.epsilon
        )
        estimate = max(raw_estimate, float(self.samples_per_round))
        self._warn_if_clipped(list(responses.values()))
        if raw_estimate < self.samples_per_round:
            self._warn_estimate_below_k(raw_estimate, len(responses))
        log(
            INFO,
            "configure_train: %d size replies, N_tilde=%.1f (alpha=%.4f)",
            len(responses),
            estimate,
            self.alpha,
        )
        self.keep_plan(
            SizeEstimatePlan(
                server_round=server_round,
                arrays=arrays,
                nodes=frozenset(responses),
                estimated_total_size=estimate,
                raw_estimate=raw_estimate,
                num_size_replies=len(responses),
            )
        )
        config[protocol.SERVER_ROUND] = server_round
        config[protocol.FEDSAMPLING_SAMPLES_PER_ROUND] = self.samples_per_round
        config[protocol.FEDSAMPLING_ESTIMATED_TOTAL_SIZE] = estimate
        config[protocol.LOCAL_STEPS] = self.local_steps
        return self.build_messages(
            dict.fromkeys(responses, config), MessageType.TRAIN, arrays
        )

    def _warn_estimate_below_k(self, raw_estimate: float, num_replies: int) -> None:
        """Say why ``N_tilde`` fell below ``K`` and what would make it usable."""
        noise = size_estimate_noise(num_replies, self.max_size, self.alpha)
        log(
            WARNING,
            "configure_train: N_tilde=%.1f below K=%d; using N_tilde=K, every sample "
            "is kept this round. With %d size replies, max_size M=%d and epsilon=%g "
            "(alpha=%.3f) the estimate's noise is sd ~ M/alpha * sqrt(C (1-alpha) "
            "(1/12 + alpha/4)) = %.0f samples, against at most C (M-1) = %d samples "
            "in all: it becomes usable (noise below a third of the total, with "
            "every node holding M-1 samples or more) from about %d nodes at this "
            "epsilon, or from epsilon=%.1f with %d nodes",
            raw_estimate,
            self.samples_per_round,
            num_replies,
            self.max_size,
            self.epsilon,
            self.alpha,
            noise,
            num_replies * (self.max_size - 1),
            nodes_for_usable_estimate(self.max_size, self.alpha),
            epsilon_for_usable_estimate(num_replies, self.max_size),
            num_replies,
        )

    def _warn_if_clipped(self, responses: list[int]) -> None:
        """Warn when too many replies sit at ``M - 1`` for sizes below ``M - 1``.

        A node below ``M - 1`` samples answers ``M - 1`` only by the random
        branch, with probability ``(1 - alpha) / (M - 1)``; a node at or
        above it also when truthful (``alpha`` more). The true sizes never
        reach the server, so this count is its only sign of a ``max_size``
        below the largest partition.
        """
        top = self.max_size - 1
        at_top = sum(response == top for response in responses)
        chance = (1 - self.alpha) / top
        if binomial_upper_tail(at_top, len(responses), chance) >= CLIPPING_SIGNIFICANCE:
            return
        clipped_fraction = min(1.0, (at_top / len(responses) - chance) / self.alpha)
        log(
            WARNING,
            "configure_train: %d of %d size replies are M-1=%d (%.1f expected if no "
            "node held %d samples or more): about %.0f%% of the nodes hold M-1 "
            "samples or more; any above count as M-1 in N_tilde, so N_tilde "
            "undercounts, rounds keep more than K samples and take larger steps; "
            "set max_size (%d) above the largest partition",
            at_top,
            len(responses),
            top,
            chance * len(responses),
            top,
            100 * clipped_fraction,
            self.max_size,
        )

    def _size_responses(
        self, server_round: int, node_ids: Iterable[int], grid: Grid
    ) -> dict[int, int]:
        """The valid randomized size replies, by node id."""
        query = {
            protocol.FEDSAMPLING_MAX_SIZE: self.max_size,
            protocol.FEDSAMPLING_EPSILON: self.epsilon,
            protocol.SERVER_ROUND: server_round,
        }
        replies = self.query(
            grid,
            {node_id: ConfigRecord(dict(query)) for node_id in node_ids},
            protocol.SIZES_QUERY,
        )
        # Every reply received spends the node's epsilon, usable or not.
        self.privacy_ledger.record(server_round, replies.keys())
        checked = self.check_replies(
            replies.values(),
            metric_keys=[protocol.FEDSAMPLING_SIZE_RESPONSE],
            context="configure_train: "
            + protocol.query_message_type(protocol.SIZES_QUERY),
        )
        responses: dict[int, int] = {}
        for reply in checked:
            value = reply.metrics[protocol.FEDSAMPLING_SIZE_RESPONSE]
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
        self.privacy_ledger.record_node_reports(
            server_round,
            {
                reply.node_id: report
                for reply in checked
                if (report := node_report(reply.metrics)) is not None
            },
        )
        return responses

    def aggregate_round(
        self, plan: SizeEstimatePlan, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """``Theta - eta sum_c G_c`` over the usable replies; the round's metrics."""
        checked = self.check_replies(
            replies, expected_arrays=plan.arrays, expected_nodes=plan.nodes
        )
        metrics = self._round_metrics(plan, len(checked))
        if not checked:
            return None, metrics
        # Every node trains: the G_c are read in place, array by array (a list
        # of N flattened copies would be 4 GB at 1,000 nodes and 1M parameters).
        arrays = self.release(
            plan.arrays,
            [reply.array_record for reply in checked],
            np.full(len(checked), -self.server_lr),
        )
        return arrays, metrics

    def _round_metrics(self, plan: SizeEstimatePlan, num_updates: int) -> MetricRecord:
        values: Mapping[str, float] = {
            "estimated-total-size": plan.estimated_total_size,
            "raw-size-estimate": plan.raw_estimate,
            "ldp-alpha": self.alpha,
            "num-size-replies": float(plan.num_size_replies),
            "num-updates": float(num_updates),
        }
        return MetricRecord(dict(values))


METHOD = MethodSpec(
    name="fedsampling",
    strategy=FedSampling,
    client_handlers="flwr_importance.clientapps.fedsampling:make_fedsampling_handlers",
    legacy="flwr_importance.compat.fedsampling:FedSampling",
    clients_per_round=False,
    central_dp_refusal=(
        "its sampling ratio K / N_tilde and its aggregate depend on the count "
        "and the values of every client's size reply: no per-client bound (a "
        "noisy-sum mode is not built)"
    ),
)
