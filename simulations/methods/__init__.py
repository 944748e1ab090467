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

A library method declared in :mod:`flwr_importance.registry` with
``app_options`` needs no module here: :class:`RegistryMethod` builds its
strategy from those run-config keys and serves its client side from the
registry. The library's methods are the registry's; ``fedavg`` and
``fedprox`` are Flower's baselines.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Protocol, TypedDict, cast

from flwr.serverapp.strategy import Strategy

from flwr_importance.clientapps import ClientHandler, TaskFactory
from flwr_importance.clientapps.standard import method_handlers
from flwr_importance.registry import (
    MethodSpec,
    app_method_names,
    methods,
)
from flwr_importance.registry import method as registry_method
from simulations.config import ExperimentConfig

# ClientApp query handlers must be registered by name when the app is imported.
QUERY_ACTIONS = ("sizes", "gradient", "norm", "loss", "update")

#: The library's own methods (Flower's fedavg/fedprox are the baselines), each
#: once: an alias (``sizeweighted`` for ``md``) would only repeat a method's run.
LIBRARY_METHODS = tuple(spec.name for spec in methods())


class Method(Protocol):
    """What a method module provides."""

    def build_strategy(self, config: ExperimentConfig, num_clients: int) -> Strategy:
        """The server-side strategy for this run."""

    def client_handlers(self, task_factory: TaskFactory) -> dict[str, ClientHandler]:
        """The ClientApp handlers, keyed by message type."""


@functools.cache
def method_modules() -> tuple[str, ...]:
    """The methods with their own module here."""
    return tuple(
        sorted(
            module.name for module in pkgutil.iter_modules(__path__) if not module.ispkg
        )
    )


@functools.cache
def available_methods() -> tuple[str, ...]:
    """Names accepted by the ``strategy`` run-config key.

    Listed once per process: the ClientApp resolves its method on every message.
    """
    return tuple(sorted({*method_modules(), *app_method_names()}))


class RegistryMethod:
    """The app side of a registry method that has no module here."""

    def __init__(self, spec: MethodSpec) -> None:
        if not spec.app_options:
            raise ValueError(
                f"method '{spec.name}' has neither a module in simulations/methods "
                "nor app_options in its METHOD declaration"
            )
        self.spec = spec

    def build_strategy(self, config: ExperimentConfig, num_clients: int) -> Strategy:
        """The strategy with ``clients-per-round``, ``seed`` and its options.

        Federated evaluation is off: the ServerApp evaluates centrally; the
        server optimizer is the run config's (``server-optimizer``).
        """
        options = {
            argument: config.option(key)
            for key, argument in self.spec.app_options.items()
        }
        if self.spec.clients_per_round:
            options["clients_per_round"] = min(config.clients_per_round, num_clients)
        return self.spec.build(
            seed=config.seed,
            fraction_evaluate=0.0,
            server_optimizer=config.server_optimizer(),
            **options,
        )

    def client_handlers(self, task_factory: TaskFactory) -> dict[str, ClientHandler]:
        """The registry's ready-made client side of the method."""
        return method_handlers(self.spec, task_factory)


@functools.cache
def load_method(name: str) -> Method:
    """The method for ``strategy = name``: its module here, or the registry's.

    An alias (``sizeweighted``) loads its method's module, where it has one.
    """
    if name not in available_methods():
        raise ValueError(
            f"unknown strategy '{name}'; available: {', '.join(available_methods())}"
        )
    if name in method_modules():
        return cast(Method, importlib.import_module(f"{__name__}.{name}"))
    spec = registry_method(name)
    if spec.name in method_modules():
        return cast(Method, importlib.import_module(f"{__name__}.{spec.name}"))
    return RegistryMethod(spec)


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
