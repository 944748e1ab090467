"""A Message-API strategy run by Flower's legacy server loop.

The legacy strategies of :mod:`flwr_importance.compat` do not re-implement any
method: each holds the library's Message-API strategy and translates the
legacy calls into its ``configure_train``/``aggregate_train``, so sampling,
per-node state, reply checks and aggregation are the very same code on both
APIs (and give the same models, see ``tests/compat``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from logging import INFO, WARNING
from typing import Any, ClassVar, cast

from flwr.app import ConfigRecord, Message
from flwr.common import FitIns, FitRes, MetricsAggregationFn, NDArrays, Parameters
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg
from flwr.serverapp.strategy import Strategy

from flwr_importance.compat.transport import (
    ProxyGrid,
    fit_ins,
    proxies_by_node,
    reply_from_fit_res,
)
from flwr_importance.legacy_wire import (
    ARRAY_LAYOUT_KEY,
    ScalarDict,
    legacy_scalars,
    parameters_of,
    record_of,
)
from flwr_importance.strategies.replies import ClientSide, ClientSideMissingError

#: Flower's centralized evaluation function of the legacy API.
EvaluateFn = Callable[[int, NDArrays, ScalarDict], tuple[float, ScalarDict] | None]


@dataclass
class LegacyOptions:
    """Flower's legacy ``FedAvg`` arguments that a legacy strategy honours.

    Each legacy class takes these either as keyword arguments, as
    ``FedAvg(...)`` does (``compat.ISFedAvg(clients_per_round=5,
    initial_parameters=..., evaluate_fn=...)``), or bundled here
    (``legacy=LegacyOptions(...)``). What each becomes:

    ============================== =============================================
    ``initial_parameters``         the initial global model
    ``evaluate_fn``                called on the server every round, as in
                                   ``FedAvg``
    ``on_fit_config_fn``           its config is merged into the train config
                                   the method sends (the method's own keys win)
    ``fraction_evaluate``,         federated evaluation, as in ``FedAvg``
    ``min_evaluate_clients``,      (uniform sampling, loss weighted by
    ``on_evaluate_config_fn``,     ``num_examples``); the method's strategy is
    ``evaluate_metrics_            told the same fraction, and FedSampling
    aggregation_fn``               refuses any (it would reveal the sizes)
    ``fit_metrics_aggregation_fn`` applied to the fit results' metrics and
                                   merged into the round's metrics
    ``accept_failures``            False: a round with a failed fit keeps the
                                   model, as in ``FedAvg``
    ``min_available_clients``      the method's ``min_available_nodes``
    ============================== =============================================

    ``fraction_fit``, ``min_fit_clients`` and ``inplace`` cannot apply (the
    method chooses its clients and aggregates its own way): passing one raises
    a ``TypeError`` naming the parameter that replaces it
    (:data:`NOT_APPLICABLE`).

    Parameters
    ----------
    initial_parameters : Parameters, optional
        The initial global model (else the server asks one client for it).
    evaluate_fn : callable, optional
        Centralized evaluation, as in ``FedAvg``.
    on_fit_config_fn, on_evaluate_config_fn : callable, optional
        Round number -> config, as in ``FedAvg``.
    fraction_evaluate : float (default: 0.0)
        Fraction of the clients asked to evaluate; 0 (no federated
        evaluation) unlike ``FedAvg``'s 1.0, since FedSampling cannot.
    min_evaluate_clients : int (default: 2)
        As in ``FedAvg``.
    evaluate_metrics_aggregation_fn, fit_metrics_aggregation_fn : callable, optional
        As in ``FedAvg``.
    accept_failures : bool (default: True)
        As in ``FedAvg``.
    min_available_clients : int, optional
        Clients to wait for before a round (the method's
        ``min_available_nodes``; its own default when None).
    max_workers : int, optional
        Threads for the extra round trips sent from ``configure_fit``.
    """

    initial_parameters: Parameters | None = None
    evaluate_fn: EvaluateFn | None = None
    on_fit_config_fn: Callable[[int], ScalarDict] | None = None
    on_evaluate_config_fn: Callable[[int], ScalarDict] | None = None
    fraction_evaluate: float = 0.0
    min_evaluate_clients: int = 2
    evaluate_metrics_aggregation_fn: MetricsAggregationFn | None = None
    fit_metrics_aggregation_fn: MetricsAggregationFn | None = None
    accept_failures: bool = True
    min_available_clients: int | None = None
    max_workers: int | None = None


#: Flower's legacy ``FedAvg`` arguments that cannot apply, and why; ``{method}``
#: is the class, ``{clients}`` the parameter that sets how many clients train.
NOT_APPLICABLE: Mapping[str, str] = {
    "fraction_fit": "{method} chooses its own clients each round; set {clients}",
    "min_fit_clients": "{method} chooses its own clients each round; set {clients}",
    "inplace": "{method} aggregates with its own weights, never FedAvg's average",
}

#: The Message-API parameter each legacy ``FedAvg`` option sets under another
#: name: a refusal by the method names the one the user wrote.
LEGACY_NAMES: Mapping[str, str] = {
    "min_available_nodes": "min_available_clients",
    "min_evaluate_nodes": "min_evaluate_clients",
}


def in_legacy_terms(message: str, forwarded: Collection[str]) -> str:
    """``message`` with each Message-API name in ``forwarded`` in its legacy name.

    Examples
    --------
    >>> in_legacy_terms("min_available_nodes must be >= 1", {"min_available_nodes"})
    'min_available_clients must be >= 1'
    """
    for name in forwarded:
        if name in LEGACY_NAMES:
            message = re.sub(rf"\b{name}\b", LEGACY_NAMES[name], message)
    return message


#: The legacy evaluation options that only matter with federated evaluation.
_EVALUATION_OPTIONS = (
    "min_evaluate_clients",
    "on_evaluate_config_fn",
    "evaluate_metrics_aggregation_fn",
)


class LegacyStrategyAdapter(FedAvg):
    """A Message-API strategy of this library as a legacy ``FedAvg`` subclass.

    ``configure_fit`` hands the Message-API strategy a :class:`ProxyGrid` over
    the legacy clients (so its extra queries reach them through
    ``ClientProxy.get_properties`` or ``ClientProxy.fit``) and turns its train
    messages into one ``FitIns`` per node; ``aggregate_fit`` turns the
    ``FitRes`` back into reply messages, in the order the messages were sent,
    and returns what the strategy's ``aggregate_train`` makes of them. A node
    that failed is simply missing from the replies, which every strategy of
    this library handles.

    Subclasses name the Message-API class in ``message_strategy_class``; the
    constructor takes Flower's legacy ``FedAvg`` arguments it can honour
    (:class:`LegacyOptions`, directly or as ``legacy``), refuses those it
    cannot (:data:`NOT_APPLICABLE`), and passes the rest on to the
    Message-API strategy, with ``min_available_clients`` as its
    ``min_available_nodes`` and the legacy evaluation settings as its own
    (every strategy of the library takes them, see
    :class:`~flwr_importance.strategies.base.StrategyOptions`).

    Parameters
    ----------
    legacy : LegacyOptions or None (default: None)
        The legacy ``FedAvg`` arguments, bundled (keyword arguments win).

    Other Parameters
    ----------------
    **options
        The Message-API strategy's (keyword-only) arguments, and Flower's
        legacy ``FedAvg`` arguments (:class:`LegacyOptions`).

    Raises
    ------
    TypeError
        A ``FedAvg`` argument that cannot apply to the method, or an
        evaluation option while federated evaluation is off.
    TypeError, ValueError
        The method's own refusal of an argument, naming a legacy option by
        its legacy name (``min_available_clients``, not
        ``min_available_nodes``; :data:`LEGACY_NAMES`).
    """

    message_strategy_class: Callable[..., Strategy]
    #: The parameter that sets how many clients a round uses (error messages).
    clients_parameter: ClassVar[str] = "clients_per_round"
    #: Legacy options this method refuses, with the reason.
    refused_options: ClassVar[Mapping[str, str]] = {}

    def __init__(self, *, legacy: LegacyOptions | None = None, **options: Any) -> None:
        legacy_options = self._legacy_options(legacy, options)
        forwarded = self._forward_to_method(legacy_options, options)
        # The method first: its own checks (e.g. FedSampling refusing
        # federated evaluation) explain a refusal better than FedAvg's would.
        try:
            self.strategy = self.message_strategy_class(**options)
        except (TypeError, ValueError) as error:
            raise type(error)(in_legacy_terms(str(error), forwarded)) from error
        super().__init__(
            fraction_fit=1.0,
            fraction_evaluate=legacy_options.fraction_evaluate,
            min_fit_clients=1,
            min_evaluate_clients=legacy_options.min_evaluate_clients,
            # FedAvg asks for this much; the Message-API strategy waits for its own.
            min_available_clients=legacy_options.min_evaluate_clients,
            evaluate_fn=legacy_options.evaluate_fn,
            on_fit_config_fn=legacy_options.on_fit_config_fn,
            on_evaluate_config_fn=legacy_options.on_evaluate_config_fn,
            accept_failures=legacy_options.accept_failures,
            initial_parameters=legacy_options.initial_parameters,
            fit_metrics_aggregation_fn=legacy_options.fit_metrics_aggregation_fn,
            evaluate_metrics_aggregation_fn=(
                legacy_options.evaluate_metrics_aggregation_fn
            ),
        )
        self.max_workers = legacy_options.max_workers
        self._sent: dict[int, Message] = {}

    @classmethod
    def _legacy_options(
        cls, legacy: LegacyOptions | None, options: dict[str, Any]
    ) -> LegacyOptions:
        """Take the legacy ``FedAvg`` arguments out of ``options``; refuse some."""
        method = cls.message_strategy_class.__name__
        for name, reason in NOT_APPLICABLE.items():
            if name in options:
                raise TypeError(
                    f"{cls.__name__}: `{name}` does not apply: "
                    + reason.format(method=method, clients=cls.clients_parameter)
                )
        given = {
            field.name: options.pop(field.name)
            for field in fields(LegacyOptions)
            if field.name in options
        }
        legacy_options = replace(legacy or LegacyOptions(), **given)
        defaults = LegacyOptions()
        for name, reason in cls.refused_options.items():
            if getattr(legacy_options, name) != getattr(defaults, name):
                raise TypeError(f"{cls.__name__}: `{name}` does not apply: {reason}")
        if legacy_options.fraction_evaluate == 0:
            for name in _EVALUATION_OPTIONS:
                if getattr(legacy_options, name) != getattr(defaults, name):
                    raise TypeError(
                        f"{cls.__name__}: `{name}` has no effect with "
                        "fraction_evaluate=0 (no federated evaluation): set "
                        "fraction_evaluate > 0 or leave it out"
                    )
        return legacy_options

    @classmethod
    def _forward_to_method(
        cls, legacy_options: LegacyOptions, options: dict[str, Any]
    ) -> set[str]:
        """Put the legacy options the Message-API strategy takes into ``options``.

        Its ``fraction_evaluate`` is the legacy one, so that what it logs
        about federated evaluation is what the legacy server does. Returns
        the Message-API names set from a legacy option.
        """
        forwarded = {
            "min_available_nodes": legacy_options.min_available_clients,
            "fraction_evaluate": legacy_options.fraction_evaluate,
            "min_evaluate_nodes": legacy_options.min_evaluate_clients,
        }
        if (
            legacy_options.min_available_clients is not None
            and "min_available_nodes" in options
            and options["min_available_nodes"] != legacy_options.min_available_clients
        ):
            raise TypeError(
                f"{cls.__name__}: min_available_clients="
                f"{legacy_options.min_available_clients} and min_available_nodes="
                f"{options['min_available_nodes']} name the same setting: give one"
            )
        given = set()
        for name, value in forwarded.items():
            if value is not None and name not in options:
                options[name] = value
                given.add(name)
        return given

    def __repr__(self) -> str:
        """The class and the Message-API strategy it runs."""
        return f"{type(self).__name__}({type(self.strategy).__name__})"

    def summary(self) -> None:
        """Log the Message-API strategy's settings and the legacy evaluation's."""
        log(INFO, "%s on the legacy Strategy API:", type(self).__name__)
        self.strategy.summary()
        log(INFO, "\t└──> Legacy evaluation: fraction %.2f", self.fraction_evaluate)

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Log the summary once, then FedAvg's initial parameters."""
        self.summary()
        return super().initialize_parameters(client_manager)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """The strategy's sampling (and queries); its train messages as FitIns."""
        config = ConfigRecord(
            dict(self.on_fit_config_fn(server_round)) if self.on_fit_config_fn else {}
        )
        grid = ProxyGrid(client_manager, self.max_workers)
        with legacy_client_hint():
            messages = self.strategy.configure_train(
                server_round, record_of(parameters), config, grid
            )
        self._sent = {message.metadata.dst_node_id: message for message in messages}
        proxies = proxies_by_node(client_manager)
        instructions = []
        for node_id, message in self._sent.items():
            if node_id in proxies:
                instructions.append((proxies[node_id], fit_ins(message)))
            else:
                log(WARNING, "configure_fit: node %d left before its fit", node_id)
        return instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, ScalarDict]:
        """The strategy's aggregation of the replies the FitRes carry.

        With ``accept_failures=False`` a round with a failure keeps the model,
        as in ``FedAvg``; ``fit_metrics_aggregation_fn``'s metrics (over the
        fit results, as in ``FedAvg``) join the strategy's.
        """
        if not self.accept_failures and failures:
            log(
                WARNING,
                "aggregate_fit: %d failures and accept_failures=False: the model "
                "is unchanged",
                len(failures),
            )
            return None, {}
        received = {int(proxy.cid): fit_res for proxy, fit_res in results}
        for node_id in sorted(self._sent.keys() - received.keys()):
            log(WARNING, "aggregate_fit: node %d returned no fit result", node_id)
        replies = [
            reply_from_fit_res(message, received[node_id])
            for node_id, message in self._sent.items()
            if node_id in received
        ]
        with legacy_client_hint():
            arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        round_metrics = legacy_scalars(metrics or {}, "metric")
        if self.fit_metrics_aggregation_fn is not None:
            round_metrics.update(
                self.fit_metrics_aggregation_fn(
                    [
                        (fit_res.num_examples, _without_layout(fit_res.metrics))
                        for _, fit_res in results
                    ]
                )
            )
        return parameters_of(arrays) if arrays is not None else None, round_metrics


#: The legacy API's client lines, added to a missing client side's error.
LEGACY_CLIENT_LINES = (
    "keep your NumPyClient and wrap its client_fn: "
    "`ClientApp(client_fn=compat.importance_client_fn(client_fn))` (methods whose "
    "client reports sizes, update norms or losses), or serve the method with "
    "`compat.handler_client_fn(task, handlers)`"
)


@contextmanager
def legacy_client_hint() -> Iterator[None]:
    """Say a missing client side's fix in the legacy API's terms too.

    A :class:`~flwr_importance.strategies.ClientSideMissingError` raised by
    the Message-API strategy inside names Message-API client lines; a legacy
    project's ClientApp is a ``client_fn``, so the error gains its lines. A
    :class:`~flwr_importance.strategies.ClientSideFailedError` stays one.
    """
    try:
        yield
    except ClientSideMissingError as error:
        client_side = ClientSide(
            lines=(
                f"{LEGACY_CLIENT_LINES} (in a Message-API ClientApp: "
                f"{error.client_side.lines})"
            ),
            docs=error.client_side.docs,
        )
        raise type(error)(
            error.method, error.message_type, error.missing, client_side
        ) from error


def _without_layout(metrics: ScalarDict) -> ScalarDict:
    """A fit result's metrics without the transport's array layout."""
    return {key: value for key, value in metrics.items() if key != ARRAY_LAYOUT_KEY}


@functools.cache
def legacy_class(name: str) -> type[LegacyStrategyAdapter]:
    """The legacy-API class of the registry method ``name``.

    Its hand-written class where the declaration names one, otherwise a
    :class:`LegacyStrategyAdapter` subclass running the method's Message-API
    strategy, named like it; the same class on every call.

    Raises
    ------
    ValueError
        The method does not run on the legacy API (e.g. several models).

    Examples
    --------
    >>> legacy_class("md").__name__
    'MDSampling'
    """
    from flwr_importance.registry import load_attribute, method

    spec = method(name)
    if not spec.legacy_api:
        raise ValueError(f"method '{spec.name}' has no legacy-API class")
    if spec.legacy:
        return cast(type[LegacyStrategyAdapter], load_attribute(spec.legacy))
    strategy = spec.strategy
    return type(
        strategy.__name__,
        (LegacyStrategyAdapter,),
        {
            "message_strategy_class": strategy,
            "__module__": "flwr_importance.compat",
            "__qualname__": strategy.__name__,
            "__doc__": GENERATED_DOC.format(
                name=strategy.__name__, implementation=_implementation_line(strategy)
            ),
        },
    )


#: The docstring of a generated legacy class; ``implementation`` is the
#: ``Implementation based on <url>`` line of the Message-API class.
GENERATED_DOC = """{name} as a legacy ``FedAvg`` subclass.

    {implementation}

    Runs :class:`flwr_importance.strategies.{name}`, whose docstring gives the
    method, its parameters and the decisions it follows.

    Parameters
    ----------
    legacy : LegacyOptions or None (default: None)
        Flower's legacy ``FedAvg`` arguments that apply, bundled
        (:class:`LegacyOptions`; keyword arguments win).

    Other Parameters
    ----------------
    **options
        The keyword arguments of :class:`flwr_importance.strategies.{name}`
        and the legacy ``FedAvg`` arguments that apply, given directly.

    Client contract
    ---------------
    The Message-API class's, over the legacy transport: its queries travel as
    ``ClientProxy.get_properties`` calls (no arrays) or ``ClientProxy.fit``
    calls (with the model) from inside ``configure_fit``, with the message
    type in the config's ``compat-message-type``. On the client,
    ``importance_client_fn(your_client_fn)`` answers them around your own
    ``NumPyClient`` (model-agnostic methods), ``handler_client_fn`` with the
    Message-API client handlers.
    """

#: The line of a strategy's docstring that names its paper.
_IMPLEMENTATION_LINE = re.compile(r"^\s*(Implementation based on \S+)$", re.M)


def _implementation_line(strategy: type) -> str:
    """The ``Implementation based on <url>`` line of ``strategy``'s docstring.

    Empty when it has none.

    Examples
    --------
    >>> from flwr_importance.strategies import MDSampling
    >>> _implementation_line(MDSampling)
    'Implementation based on https://arxiv.org/abs/1907.02189'
    """
    match = _IMPLEMENTATION_LINE.search(strategy.__doc__ or "")
    return match.group(1) if match else ""
