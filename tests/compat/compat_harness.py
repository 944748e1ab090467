"""Run a legacy strategy and its Message-API twin on the same seeded federation.

The Message-API strategy runs through ``strategy.start`` on an
:class:`~flwr_importance.tooling.testing.InProcessGrid` with the simulation's ClientApp;
the legacy one through Flower's own legacy server loop (``flwr.server.Server``
with a ``SimpleClientManager``) over in-process ``ClientProxy`` objects that
call the ``NumPyClient`` of :func:`flwr_importance.compat.handler_client_fn`.
Both federations have the same node ids, partitions and run config, and each
node keeps one ``Context`` (its ``state`` persists across rounds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
from flwr.app import ArrayRecord, Context, RecordDict
from flwr.client import Client
from flwr.common import (
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    NDArrays,
    ReconnectIns,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import Server, SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.serverapp.strategy import Strategy

from flwr_importance.clientapps import ClientHandler, TaskFactory
from flwr_importance.compat import LegacyOptions, handler_client_fn
from flwr_importance.tooling.testing import InProcessGrid
from flwr_importance.tooling.testing.grid import partition_node_config
from simulations.client_app import app as client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.task import federated_data, global_model, local_task

ClientFn = Callable[[Context], Client]


class InProcessClientProxy(ClientProxy):
    """A legacy ``ClientProxy`` calling ``client_fn(context)`` in this process."""

    def __init__(self, context: Context, client_fn: ClientFn) -> None:
        super().__init__(str(context.node_id))
        self.context = context
        self.client_fn = client_fn

    def get_properties(
        self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None
    ) -> GetPropertiesRes:
        """The client's ``get_properties``."""
        return self.client_fn(self.context).get_properties(ins)

    def get_parameters(
        self, ins: GetParametersIns, timeout: float | None, group_id: int | None
    ) -> GetParametersRes:
        """The client's ``get_parameters``."""
        return self.client_fn(self.context).get_parameters(ins)

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        """The client's ``fit``."""
        return self.client_fn(self.context).fit(ins)

    def evaluate(
        self, ins: EvaluateIns, timeout: float | None, group_id: int | None
    ) -> EvaluateRes:
        """The client's ``evaluate``."""
        return self.client_fn(self.context).evaluate(ins)

    def reconnect(
        self, ins: ReconnectIns, timeout: float | None, group_id: int | None
    ) -> DisconnectRes:
        """Nothing to reconnect in process."""
        return DisconnectRes(reason="")


class TwinFederation:
    """One seeded federation for both APIs: run config, node ids, initial model."""

    def __init__(
        self, overrides: Mapping[str, bool | int | float | str], num_nodes: int
    ):
        # Both APIs' runs are compared on the same draws: FedSampling's nodes
        # use their seeded coins (unsafe for privacy, docs/privacy.md).
        same_draws = {"fedsampling-unsafe-reproducible-coins": True}
        self.run_config = resolve_run_config(
            {**same_draws, **overrides, "num-supernodes": num_nodes}
        )
        self.grid = InProcessGrid(client_app, num_nodes, self.run_config, seed=1)
        config = ExperimentConfig.from_run_config(self.run_config)
        model = global_model(config, federated_data(config, num_nodes))
        self.initial = [value.detach().numpy() for value in model.state_dict().values()]
        self.initial_record = ArrayRecord(model.state_dict())

    def run_message_api(self, strategy: Strategy, num_rounds: int) -> NDArrays:
        """The Message-API strategy's final model on the in-process grid."""
        result = strategy.start(
            grid=self.grid, initial_arrays=self.initial_record, num_rounds=num_rounds
        )
        return result.arrays.to_numpy_ndarrays()

    def legacy_client_manager(
        self, handlers_factory: Callable[[TaskFactory], Mapping[str, ClientHandler]]
    ) -> SimpleClientManager:
        """The same nodes (ids, partitions, fresh state) behind legacy proxies."""
        client_fn = handler_client_fn(local_task, handlers_factory)
        manager = SimpleClientManager()
        for node_id in sorted(self.grid.get_node_ids()):
            context = Context(
                run_id=self.grid.run.run_id,
                node_id=node_id,
                node_config=partition_node_config(
                    self.grid.partition_of(node_id), self.grid.num_nodes
                ),
                state=RecordDict(),
                run_config=dict(self.run_config),
            )
            manager.register(InProcessClientProxy(context, client_fn))
        return manager

    def legacy_options(self) -> LegacyOptions:
        """Legacy options starting from the same initial model."""
        return LegacyOptions(initial_parameters=ndarrays_to_parameters(self.initial))


def run_legacy(
    strategy: LegacyStrategy, manager: SimpleClientManager, num_rounds: int
) -> NDArrays:
    """The legacy strategy's final model after Flower's legacy server loop."""
    server = Server(client_manager=manager, strategy=strategy)
    server.fit(num_rounds, timeout=None)
    return parameters_to_ndarrays(server.parameters)


def max_difference(first: NDArrays, second: NDArrays) -> float:
    """Largest absolute entry-wise difference of two models (same shapes)."""
    assert [a.shape for a in first] == [b.shape for b in second]
    return max(float(np.max(np.abs(a - b))) for a, b in zip(first, second, strict=True))
