"""The strategies of the simulation app: one module per ``strategy`` name.

A method module defines two functions:

- ``build_strategy(config, num_clients) -> flwr.serverapp.strategy.Strategy``
- ``client_handlers(task_factory) -> dict[str, ClientHandler]``, keyed by the
  message type the handler serves (``"train"``, ``"evaluate"``,
  ``"query.<action>"``, with the action one of :data:`QUERY_ACTIONS`).

Optionally, a method that trains several models at once (``mmfl``) defines
``start_strategy(grid, config, num_clients) -> flwr.serverapp.strategy.Result``
and the ServerApp calls it instead of starting ``build_strategy``'s strategy on
one model itself.

Adding a method is adding a module here: nothing else needs to change.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Protocol, TypedDict, cast

from flwr.serverapp.strategy import Strategy

from flwr_importance.clientapps import ClientHandler, TaskFactory
from simulations.config import ExperimentConfig

# ClientApp query handlers must be registered by name when the app is imported.
QUERY_ACTIONS = ("sizes", "gradient", "norm", "loss", "update")

#: The library's own strategies: every method but Flower's fedavg/fedprox baselines.
LIBRARY_METHODS = (
    "isfedavg",
    "folb",
    "fedsampling",
    "sizeweighted",
    "clustered",
    "md",
    "ocs",
    "mmfl",
)


class Method(Protocol):
    """What a method module provides."""

    def build_strategy(self, config: ExperimentConfig, num_clients: int) -> Strategy:
        """The server-side strategy for this run."""

    def client_handlers(self, task_factory: TaskFactory) -> dict[str, ClientHandler]:
        """The ClientApp handlers, keyed by message type."""


@functools.cache
def available_methods() -> tuple[str, ...]:
    """Names accepted by the ``strategy`` run-config key.

    Listed once per process: the ClientApp resolves its method on every message.
    """
    return tuple(
        sorted(
            module.name for module in pkgutil.iter_modules(__path__) if not module.ispkg
        )
    )


def load_method(name: str) -> Method:
    """The method module for ``strategy = name``."""
    if name not in available_methods():
        raise ValueError(
            f"unknown strategy '{name}'; available: {', '.join(available_methods())}"
        )
    return cast(Method, importlib.import_module(f"{__name__}.{name}"))


class FedAvgSampling(TypedDict):
    """The sampling arguments of Flower's ``FedAvg``."""

    fraction_train: float
    min_train_nodes: int
    min_available_nodes: int
    fraction_evaluate: float


def uniform_sampling(config: ExperimentConfig, num_clients: int) -> FedAvgSampling:
    """Keyword arguments making Flower's ``FedAvg`` sample ``clients-per-round``.

    ``FedAvg`` samples ``max(int(fraction_train * n), min_train_nodes)`` nodes;
    federated evaluation is off because the ServerApp evaluates centrally.
    """
    clients_per_round = min(config.clients_per_round, num_clients)
    return FedAvgSampling(
        fraction_train=clients_per_round / num_clients,
        min_train_nodes=clients_per_round,
        min_available_nodes=clients_per_round,
        fraction_evaluate=0.0,
    )
