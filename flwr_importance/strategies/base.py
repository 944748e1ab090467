"""The base of every strategy of the library: :class:`ImportanceStrategy`.

It owns what each strategy would otherwise repeat: the seeded generator, the
shared settings and their checks, the round plan ``configure_train`` keeps for
``aggregate_train`` (checked against the round number), the one way messages
are built, reply metrics in the form Flower's aggregators read, federated
evaluation that survives bad replies, a summary of what applies, the refusal
of FedAvg's arguments the methods replace, and the reply ledger: dropped
replies counted for the end of a run, and the run stopped with
:class:`~flwr_importance.strategies.replies.ClientSideMissingError` when the
ClientApp lacks the method's client side.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from logging import INFO, WARNING
from numbers import Real
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypedDict, TypeVar

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
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import sample_nodes

from flwr_importance import protocol
from flwr_importance.aggregation.server_optimizers import (
    OptimizerState,
    ServerOptimizer,
    check_server_optimizer,
)
from flwr_importance.strategies.arrays import Release, linear_release, optimizer_step
from flwr_importance.strategies.messages import (
    SharedArrays,
    node_messages,
    send_query,
)
from flwr_importance.strategies.replies import (
    NO_REPLY,
    CheckedReply,
    ClientSide,
    ReplyChecks,
    ReplyLedger,
    check_replies,
    metric_contents,
)
from flwr_importance.strategies.summary import log_settings
from flwr_importance.validation import check_count, check_keys, check_positive

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

#: Flower's signature of ``train_metrics_aggr_fn`` and ``evaluate_metrics_aggr_fn``.
MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]


@dataclass(frozen=True, kw_only=True)
class RoundPlan:
    """What ``configure_train`` decided, kept for ``aggregate_train`` of its round.

    Each strategy subclasses it (a frozen, keyword-only dataclass too) with
    what its aggregation needs; :meth:`ImportanceStrategy.plan_for` hands it
    back only for the round it was made for.

    Attributes
    ----------
    server_round : int
        The round the plan belongs to.
    arrays : ArrayRecord
        The model the round started from: the template replies are checked
        against and the base of the new model.
    nodes : frozenset of int
        The nodes sent a ``train`` message; replies from others are dropped.
    """

    server_round: int
    arrays: ArrayRecord
    nodes: frozenset[int]


PlanT = TypeVar("PlanT", bound=RoundPlan)


class StrategyOptions(TypedDict, total=False):
    """The keyword arguments every strategy takes (``**options``).

    Documented on :class:`ImportanceStrategy`; a strategy's constructor takes
    them as ``**options: Unpack[StrategyOptions]`` and passes them on.
    """

    seed: int
    query_timeout: float
    fraction_evaluate: float | None
    min_evaluate_nodes: int
    min_available_nodes: int
    weighted_by_key: str
    arrayrecord_key: str
    configrecord_key: str
    evaluate_metrics_aggr_fn: MetricsAggregation | None
    server_optimizer: ServerOptimizer | None


class ImportanceStrategy(FedAvg, Generic[PlanT]):
    """Flower's ``FedAvg`` with what every strategy of the library shares.

    Every strategy of the library subclasses it with its own
    ``configure_train`` and :meth:`aggregate_round`; what they share lives
    here.

    * ``self.rng``: a ``numpy.random.Generator`` seeded with ``seed``.
    * One round plan (a :class:`RoundPlan` subclass): ``configure_train``
      stores it with :meth:`keep_plan`; :meth:`aggregate_train` fetches it
      with :meth:`plan_for`, which refuses (logs, returns None) a missing
      plan or one made for another round, so the model is left unchanged
      rather than updated from stale state, and hands it to
      :meth:`aggregate_round`.
    * Messages built one way, :meth:`build_messages` (and :meth:`query` for
      ``query.<action>`` round trips), honouring ``arrayrecord_key`` and
      ``configrecord_key``.
    * :meth:`train_metrics`, the checked replies' metrics averaged by
      ``train_metrics_aggr_fn``.
    * Federated evaluation that survives bad replies: ``FedAvg``'s
      ``aggregate_evaluate`` raises ``InconsistentMessageReplies`` (ending the
      run) when one reply lacks the weighting metric and divides by zero when
      the weights sum to zero; here :func:`check_replies` drops and logs such
      replies by node.
    * One seam for the server step, :meth:`server_step`, and one for the
      released model, ``self.release`` (:class:`.arrays.Release`).
    * :meth:`summary`, logging only the settings that apply; subclasses log
      their own first and then call ``super().summary()``.
    * ``self.reply_ledger`` (:class:`~flwr_importance.strategies.replies.ReplyLedger`),
      fed by :meth:`query` and :meth:`check_replies` (which subclasses use
      instead of the plain functions): it counts the dropped replies, logged
      by message type and reason when :meth:`start` ends, and raises
      :class:`~flwr_importance.strategies.replies.ClientSideMissingError`
      naming :attr:`client_side` when every node lacks the method's client
      side (a plain FedAvg ClientApp).

    The parameters below are documented here once: every strategy takes them
    as keyword-only ``**options`` (:class:`StrategyOptions`; FOLB and
    ISFedAvg also name ``train_metrics_aggr_fn``) and documents only its own
    parameters and what the shared ones mean for it.

    Parameters
    ----------
    seed : int (default: 0)
        Seeds ``self.rng`` (and any draw a subclass derives from it); >= 0.
    query_timeout : float (default: 600.0)
        Seconds to wait for the replies to a ``query.<action>`` message.
    fraction_evaluate : float or None (default: None)
        Fraction of the connected nodes sampled (uniformly, as in ``FedAvg``)
        for federated evaluation, in ``[0, 1]``; 0 turns it off. None: 1.0,
        or 0.0 for a class without federated evaluation (which refuses any
        other value, with its reason).
    min_evaluate_nodes : int (default: 2)
        Fewest nodes sampled for federated evaluation, as in ``FedAvg``.
    min_available_nodes : int (default: 1)
        A round waits until this many nodes are connected (>= 1); every
        strategy warns when fewer nodes than it samples are connected.
    weighted_by_key : str (default: "num-examples")
        The metric that weights the averages of reply metrics.
    arrayrecord_key : str (default: "arrays")
        Key of the model's ArrayRecord in the messages sent.
    configrecord_key : str (default: "config")
        Key of the ConfigRecord in the messages sent.
    evaluate_metrics_aggr_fn : callable or None (default: None)
        Averages the evaluate replies' metrics, as in ``FedAvg``; None: a
        mean weighted by ``weighted_by_key``.
    train_metrics_aggr_fn : callable or None (default: None)
        Averages the train replies' metrics, in the classes that do
        (:attr:`aggregates_train_metrics`); None: a mean weighted by
        ``weighted_by_key``.
    server_optimizer : ServerOptimizer or None (default: None)
        ``ServerAdam``, ``ServerYogi``, ``ServerAdagrad`` or ``ServerMomentum``:
        steps on the round's update estimate; None: the method's own step.

    Other Parameters
    ----------------
    **unknown
        Refused with a ``TypeError``: FedAvg's ``fraction_train`` and
        ``min_train_nodes`` (naming what replaces them), and any unknown
        keyword, as Python refuses it.

    Raises
    ------
    TypeError
        A setting of the wrong type (e.g. a float ``seed``); FedAvg's
        ``fraction_train`` or ``min_train_nodes`` (the message names
        :attr:`round_size`, the replacement), ``train_metrics_aggr_fn`` for a
        class that does not average train metrics, or an unknown keyword.
    ValueError
        A setting out of its range, or federated evaluation asked of a class
        without it.
    """

    #: Why the class has no federated evaluation; None when it has.
    no_federated_evaluation: ClassVar[str | None] = None
    #: Shared settings the class never reads: left out of :meth:`summary`.
    unused_settings: ClassVar[frozenset[str]] = frozenset()
    #: The lines a plain FedAvg ClientApp needs for the method, and their docs
    #: section: the one place :class:`ClientSideMissingError` reads them from.
    client_side: ClassVar[ClientSide]
    #: How the method sizes a round, for the refusal of FedAvg's
    #: ``fraction_train``/``min_train_nodes``.
    round_size: ClassVar[str] = (
        "it samples clients_per_round nodes per round; pass clients_per_round=..."
    )
    #: Whether the class averages the train replies' metrics with
    #: ``train_metrics_aggr_fn`` (the others compute their own round metrics).
    aggregates_train_metrics: ClassVar[bool] = False

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        """Refuse FedAvg's round-size arguments, naming :attr:`round_size`.

        Here, before Python checks the signature: else ``fraction_train=0.5``
        alone fails on the method's missing ``clients_per_round``.
        """
        for argument in ("fraction_train", "min_train_nodes"):
            if argument in kwargs:
                raise TypeError(
                    f"{argument} does not apply to {cls.__name__}: {cls.round_size}"
                )
        return super().__new__(cls)

    def __init__(
        self,
        *,
        seed: int = 0,
        query_timeout: float = 600.0,
        fraction_evaluate: float | None = None,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 1,
        weighted_by_key: str = protocol.NUM_EXAMPLES,
        arrayrecord_key: str = protocol.ARRAY_RECORD,
        configrecord_key: str = protocol.CONFIG_RECORD,
        evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        server_optimizer: ServerOptimizer | None = None,
        **unknown: Any,
    ) -> None:
        self._refuse_fedavg_only(unknown, train_metrics_aggr_fn)
        self.seed = check_count("seed", seed, minimum=0)
        self.query_timeout = check_positive("query_timeout", query_timeout)
        fraction = self._fraction_evaluate(fraction_evaluate)
        check_count("min_evaluate_nodes", min_evaluate_nodes, minimum=0)
        check_count("min_available_nodes", min_available_nodes)
        check_keys(weighted_by_key, arrayrecord_key, configrecord_key)
        for name, function in (
            ("evaluate_metrics_aggr_fn", evaluate_metrics_aggr_fn),
            ("train_metrics_aggr_fn", train_metrics_aggr_fn),
        ):
            if function is not None and not callable(function):
                raise TypeError(f"{name} must be callable or None, got {function!r}")
        super().__init__(
            fraction_evaluate=fraction,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        # The record keys FedAvg reads, checked together above (its own
        # constructor takes any value).
        self.weighted_by_key = weighted_by_key
        self.arrayrecord_key = arrayrecord_key
        self.configrecord_key = configrecord_key
        self.rng = np.random.default_rng(self.seed)
        self.server_optimizer = check_server_optimizer(server_optimizer)
        self.optimizer_state = OptimizerState()
        self._plan: PlanT | None = None
        self.release: Release = linear_release
        self.reply_ledger = ReplyLedger(type(self).__name__, self.client_side)

    def _refuse_fedavg_only(
        self,
        unknown: Mapping[str, object],
        train_metrics_aggr_fn: MetricsAggregation | None,
    ) -> None:
        """Refuse unknown keywords, and ``train_metrics_aggr_fn`` if unused."""
        name = type(self).__name__
        if unknown:
            raise TypeError(
                f"{name}.__init__() got an unexpected keyword argument "
                f"'{next(iter(unknown))}'"
            )
        if train_metrics_aggr_fn is not None and not self.aggregates_train_metrics:
            raise TypeError(
                f"train_metrics_aggr_fn does not apply to {name}: its round "
                "metrics are its own (listed in its docstring), not an average "
                "of the train replies' metrics"
            )

    # -- a run ---------------------------------------------------------------------
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's ``Strategy.start``, then the summary of the dropped replies.

        The replies dropped during the run are counted from zero and logged
        by message type and reason when it ends, also when it ends with an
        error (e.g. :class:`ClientSideMissingError`). The server optimizer
        starts from zero moments.
        """
        with self.run_scope():
            return super().start(
                grid,
                initial_arrays,
                num_rounds=num_rounds,
                timeout=timeout,
                train_config=train_config,
                evaluate_config=evaluate_config,
                evaluate_fn=evaluate_fn,
            )

    @contextmanager
    def run_scope(self) -> Iterator[None]:
        """A run's bookkeeping (see :meth:`start`), also for a wrapper's run."""
        self.reply_ledger = ReplyLedger(type(self).__name__, self.client_side)
        self.optimizer_state = OptimizerState()
        try:
            yield
        finally:
            self.reply_ledger.log_summary()

    def _fraction_evaluate(self, fraction: float | None) -> float:
        """The checked ``fraction_evaluate``, its default filled in."""
        reason = self.no_federated_evaluation
        if fraction is None:
            return 1.0 if reason is None else 0.0
        if isinstance(fraction, bool) or not isinstance(fraction, Real):
            raise TypeError(f"fraction_evaluate must be a number, got {fraction!r}")
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction_evaluate must lie in [0, 1], got {fraction}")
        if reason is not None and fraction != 0:
            raise ValueError(f"fraction_evaluate={fraction}: {reason}")
        return float(fraction)

    # -- the round plan ------------------------------------------------------------
    def keep_plan(self, plan: PlanT) -> None:
        """Keep ``plan`` for ``aggregate_train`` of ``plan.server_round``."""
        self._plan = plan

    @property
    def plan(self) -> PlanT | None:
        """The latest round's plan (None before the first)."""
        return self._plan

    def plan_for(self, server_round: int) -> PlanT | None:
        """The plan ``configure_train`` kept for ``server_round``, or None (logged).

        None when no plan was kept (``configure_train`` skipped the round or
        was not called) or the plan is another round's: ``aggregate_train``
        then leaves the model unchanged.
        """
        plan = self._plan
        if plan is None:
            log(
                WARNING,
                "aggregate_train: no plan for round %d (configure_train skipped it "
                "or was not called); the model is unchanged",
                server_round,
            )
            return None
        if plan.server_round != server_round:
            log(
                WARNING,
                "aggregate_train: the kept plan is round %d's, not round %d's; "
                "the model is unchanged",
                plan.server_round,
                server_round,
            )
            return None
        return plan

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The new model (by :meth:`server_step`) and the round's metrics.

        No plan for ``server_round`` (:meth:`plan_for` logs why): ``(None, None)``.
        """
        plan = self.plan_for(server_round)
        if plan is None:
            return None, None
        replies = list(replies)
        replied = {reply.metadata.src_node_id for reply in replies}
        self.reply_ledger.record(MessageType.TRAIN, NO_REPLY, len(plan.nodes - replied))
        arrays, metrics = self.aggregate_round(plan, replies)
        return self.server_step(plan, arrays), metrics

    def server_step(
        self, plan: PlanT, aggregated: ArrayRecord | None
    ) -> ArrayRecord | None:
        """The new model from ``aggregated``, the model the method's step gives.

        With a ``server_optimizer``, ``aggregated - plan.arrays`` (the round's
        update estimate) is its pseudo-gradient (docs/methods.md, section
        "Server optimizers"); without one, ``aggregated`` itself. None stays
        None and does not step the optimizer, as in Flower's ``FedOpt``.
        """
        if aggregated is None or self.server_optimizer is None:
            return aggregated
        new_model, self.optimizer_state = optimizer_step(
            self.server_optimizer,
            self.optimizer_state,
            plan.arrays,
            aggregated,
            plan.server_round,
        )
        return new_model

    @abstractmethod
    def aggregate_round(
        self, plan: PlanT, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The new model and the round's metrics from the replies to ``plan``.

        ``(None, None)`` (or ``(None, metrics)``) leaves the model unchanged.
        """

    # -- messages ------------------------------------------------------------------
    def build_messages(
        self,
        node_configs: Mapping[int, ConfigRecord],
        message_type: str,
        arrays: SharedArrays = None,
    ) -> list[Message]:
        """One message per node: its config under ``configrecord_key`` and the arrays.

        ``arrays`` goes to every node: one ArrayRecord (under
        ``arrayrecord_key``) or a mapping of named ArrayRecords (e.g. one per
        model, named by the protocol).
        """
        return node_messages(
            node_configs,
            message_type,
            arrays,
            self.arrayrecord_key,
            self.configrecord_key,
        )

    def query(
        self,
        grid: Grid,
        node_configs: Mapping[int, ConfigRecord],
        action: str,
        arrays: SharedArrays = None,
    ) -> dict[int, Message]:
        """The good replies to ``query.<action>`` sent to the nodes, by node id.

        Waits ``query_timeout`` seconds; nodes that fail or do not answer are
        logged and left out.
        """
        messages = self.build_messages(
            node_configs, protocol.query_message_type(action), arrays
        )
        return send_query(grid, messages, action, self.query_timeout, self.reply_ledger)

    # -- replies -------------------------------------------------------------------
    def check_replies(
        self, replies: Iterable[Message], **checks: Unpack[ReplyChecks]
    ) -> list[CheckedReply]:
        """:func:`~flwr_importance.strategies.replies.check_replies`, on the ledger.

        The dropped replies are counted for the run's summary, and a message
        type no node answered with the method's client side raises
        :class:`~flwr_importance.strategies.replies.ClientSideMissingError`.
        """
        return check_replies(replies, ledger=self.reply_ledger, **checks)

    def train_metrics(self, replies: Sequence[CheckedReply]) -> MetricRecord:
        """The replies' metrics averaged by ``train_metrics_aggr_fn``.

        Weighted by ``weighted_by_key`` with Flower's default aggregation. When
        the weights of the replies sum to zero (every usable reply has
        ``num-examples = 0``) the average is undefined: logged, and the round's
        metrics are an empty MetricRecord (the model is still aggregated).
        """
        if sum(reply.metrics[self.weighted_by_key] for reply in replies) <= 0:
            log(
                WARNING,
                "train_metrics: the %d usable replies' '%s' sum to zero; "
                "no train metrics this round",
                len(replies),
                self.weighted_by_key,
            )
            return MetricRecord()
        return self.train_metrics_aggr_fn(
            metric_contents(replies), self.weighted_by_key
        )

    # -- federated evaluation ------------------------------------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """``evaluate`` messages to a uniform sample of the nodes, as ``FedAvg``'s."""
        if self.fraction_evaluate == 0.0:
            return []
        num_nodes = int(len(list(grid.get_node_ids())) * self.fraction_evaluate)
        sample_size = max(num_nodes, self.min_evaluate_nodes)
        # Flower's own sampler: the same nodes as FedAvg's for the same seed.
        node_ids, connected = sample_nodes(grid, self.min_available_nodes, sample_size)
        log(
            INFO,
            "configure_evaluate: sampled %d nodes (out of %d)",
            len(node_ids),
            len(connected),
        )
        config[protocol.SERVER_ROUND] = server_round
        return self.build_messages(
            dict.fromkeys(node_ids, config), MessageType.EVALUATE, arrays
        )

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Weighted mean of the checked replies' metrics (None if none is usable).

        With federated evaluation off on purpose (``fraction_evaluate = 0``)
        nothing was asked and nothing is logged; a warning means evaluation
        was asked for and no reply could be used.
        """
        replies = list(replies)
        if not replies and self.fraction_evaluate == 0.0:
            return None
        checked = self.check_replies(
            replies,
            nonnegative_keys=[self.weighted_by_key],
            context="aggregate_evaluate",
        )
        if sum(reply.metrics[self.weighted_by_key] for reply in checked) <= 0:
            log(WARNING, "aggregate_evaluate: no usable reply with a positive weight")
            return None
        return self.evaluate_metrics_aggr_fn(
            metric_contents(checked), self.weighted_by_key
        )

    # -- summary -------------------------------------------------------------------
    def unused_settings_now(self) -> frozenset[str]:
        """The shared settings this strategy, as configured, never reads.

        :attr:`unused_settings` by default; a subclass whose use of a setting
        depends on its options (FOLB queries only in its two-set mode) adds
        to it.
        """
        return self.unused_settings

    def summary(self) -> None:
        """Log the shared settings that apply to this strategy.

        Subclasses log their own settings (:func:`log_settings`) and then call
        ``super().summary()``; nothing logged is a setting the run ignores.
        """
        unused = self.unused_settings_now()
        shared: dict[str, object] = {}
        if "seed" not in unused:
            shared["Seed"] = self.seed
        if "query_timeout" not in unused:
            shared["Query timeout"] = f"{self.query_timeout:g} s"
        shared["Minimum available nodes"] = self.min_available_nodes
        log_settings("Shared settings", shared)
        if self.server_optimizer is not None:
            optimizer = self.server_optimizer
            settings = {name: f"{x:g}" for name, x in optimizer.settings().items()}
            log_settings(f"Server optimizer: {optimizer.title()}", settings)
        if self.fraction_evaluate == 0.0:
            evaluation: dict[str, object] = {
                "Off": self.no_federated_evaluation or "fraction_evaluate = 0"
            }
        else:
            evaluation = {
                "Fraction": f"{self.fraction_evaluate:.2f}",
                "Minimum nodes": self.min_evaluate_nodes,
                "Weighted by": repr(self.weighted_by_key),
            }
        log_settings("Federated evaluation", evaluation)
        keys = {"ConfigRecord": repr(self.configrecord_key)}
        if "arrayrecord_key" not in unused:
            keys = {"ArrayRecord": repr(self.arrayrecord_key), **keys}
        log_settings("Keys in records", keys, last=True)
