"""A Message-API strategy run by Flower's legacy server loop.

The legacy strategies of :mod:`flwr_importance.compat` do not re-implement any
method: each holds the library's Message-API strategy and translates the
legacy calls into its ``configure_train``/``aggregate_train``, so sampling,
per-node state, reply checks and aggregation are the very same code on both
APIs (and give the same models, see ``tests/compat``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

from flwr.app import ConfigRecord, Message
from flwr.common import FitIns, FitRes, MetricsAggregationFn, NDArrays, Parameters
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg
from flwr.serverapp.strategy import Strategy

from flwr_importance.compat.transport import (
    ProxyGrid,
    ScalarDict,
    fit_ins,
    legacy_scalars,
    parameters_of,
    proxies_by_node,
    record_of,
    reply_from_fit_res,
)

#: Flower's centralized evaluation function of the legacy API.
EvaluateFn = Callable[[int, NDArrays, ScalarDict], tuple[float, ScalarDict] | None]


@dataclass
class LegacyOptions:
    """The legacy ``FedAvg`` options a legacy strategy of this library takes.

    Federated evaluation is the legacy ``FedAvg``'s (uniform sampling, loss
    weighted by ``num_examples``), as the Message-API strategies use
    ``FedAvg``'s; it is off by default because the evaluate replies carry
    ``num-examples``, which FedSampling keeps private.

    Parameters
    ----------
    initial_parameters : Parameters, optional
        The initial global model (else the server asks one client for it).
    evaluate_fn : callable, optional
        Centralized evaluation, as in ``FedAvg``.
    on_fit_config_fn, on_evaluate_config_fn : callable, optional
        Round number -> config, as in ``FedAvg``; the fit config is what the
        Message-API strategy receives as its ``config``.
    fraction_evaluate : float (default: 0.0)
        Fraction of the clients asked to evaluate.
    min_evaluate_clients : int (default: 2)
        As in ``FedAvg``.
    evaluate_metrics_aggregation_fn : callable, optional
        As in ``FedAvg``.
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
    max_workers: int | None = None


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
    constructor passes its arguments (but ``legacy``) on to it.

    Parameters
    ----------
    *args, **options
        The Message-API strategy's arguments.
    legacy : LegacyOptions, optional
        Legacy ``FedAvg`` options (initial model, evaluation).
    """

    message_strategy_class: Callable[..., Strategy]

    def __init__(
        self, *args: Any, legacy: LegacyOptions | None = None, **options: Any
    ) -> None:
        legacy_options = legacy or LegacyOptions()
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
            initial_parameters=legacy_options.initial_parameters,
            evaluate_metrics_aggregation_fn=(
                legacy_options.evaluate_metrics_aggregation_fn
            ),
        )
        self.strategy = self.message_strategy_class(*args, **options)
        self.max_workers = legacy_options.max_workers
        self._sent: dict[int, Message] = {}

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
        """The strategy's aggregation of the replies the FitRes carry."""
        received = {int(proxy.cid): fit_res for proxy, fit_res in results}
        for node_id in sorted(self._sent.keys() - received.keys()):
            log(WARNING, "aggregate_fit: node %d returned no fit result", node_id)
        replies = [
            reply_from_fit_res(message, received[node_id])
            for node_id, message in self._sent.items()
            if node_id in received
        ]
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        return (
            parameters_of(arrays) if arrays is not None else None,
            legacy_scalars(metrics or {}, "metric"),
        )
