"""The strategies of the simulation app: one module per ``strategy`` name.

A method module defines two functions:

- ``build_strategy(config, num_clients) -> flwr.serverapp.strategy.Strategy``
- ``client_handlers(task_factory) -> dict[str, ClientHandler]``, keyed by the
  message type the handler serves (``"train"``, ``"evaluate"``,
  ``"query.<action>"``, with the action one of :data:`QUERY_ACTIONS`).

A library method's module also declares how the tests and benchmarks run it,
``TOOLING = MethodTooling(...)``
(:mod:`flwr_importance.tooling.declarations`; :mod:`simulations.tooling`
collects them).

Optionally, a method that trains several models at once (``mmfl``) defines
``start_strategy(grid, config, num_clients) -> flwr.serverapp.strategy.Result``
and the ServerApp calls it instead of starting ``build_strategy``'s strategy on
one model itself.

Every library method (:func:`flwr_importance.registry.methods`) has its
module here, named after its ``strategy`` name with ``_`` for ``-``;
``fedavg`` and ``fedprox`` are Flower's baselines. :data:`ALIASES` are other
``strategy`` names of a method.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Protocol, TypedDict, cast

from flwr.serverapp.strategy import Strategy

from flwr_importance.clientapps import ClientHandler, TaskFactory
from flwr_importance.registry import methods
from simulations.config import ExperimentConfig

# ClientApp query handlers must be registered by name when the app is imported.
QUERY_ACTIONS = ("sizes", "gradient", "norm", "loss", "update")

#: The library's own methods (Flower's fedavg/fedprox are the baselines), each
#: once: an alias (``sizeweighted`` for ``md``) would only repeat a method's run.
LIBRARY_METHODS = tuple(spec.name for spec in methods())

#: Other ``strategy`` names of a method: FedSampling's comparisons call MD
#: sampling size-weighted client sampling.
ALIASES = {"sizeweighted": "md"}


class Method(Protocol):
    """What a method module provides."""

    def build_strategy(self, config: ExperimentConfig, num_clients: int) -> Strategy:
        """The server-side strategy for this run."""

    def client_handlers(self, task_factory: TaskFactory) -> dict[str, ClientHandler]:
        """The ClientApp handlers, keyed by message type."""


@functools.cache
def method_modules() -> tuple[str, ...]:
    """The ``strategy`` names of the methods with a module here."""
    return tuple(
        sorted(
            module.name.replace("_", "-")
            for module in pkgutil.iter_modules(__path__)
            if not module.ispkg
        )
    )


@functools.cache
def available_methods() -> tuple[str, ...]:
    """Names accepted by the ``strategy`` run-config key.

    Listed once per process: the ClientApp resolves its method on every message.
    """
    return tuple(sorted({*method_modules(), *ALIASES}))


def app_names(method: str) -> tuple[str, ...]:
    """The ``strategy`` names of ``method``: its own, then its aliases."""
    return (method, *(alias for alias, name in ALIASES.items() if name == method))


@functools.cache
def load_method(name: str) -> Method:
    """The method module for ``strategy = name`` (an alias: its method's)."""
    if name not in available_methods():
        raise ValueError(
            f"unknown strategy '{name}'; available: {', '.join(available_methods())}"
        )
    module = ALIASES.get(name, name).replace("-", "_")
    return cast(Method, importlib.import_module(f"{__name__}.{module}"))


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
