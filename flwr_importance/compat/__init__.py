"""The library's strategies on Flower's legacy Strategy API (``configure_fit``).

For projects built on ``ServerApp(server_fn=...)`` returning
``ServerAppComponents(strategy=...)`` with ``NumPyClient`` clients. Each class
subclasses ``flwr.server.strategy.FedAvg`` and runs the Message-API strategy of
the same name (:mod:`flwr_importance.strategies`), so both APIs share every
line of sampling and aggregation; :mod:`.transport` carries the extra round
trips over ``ClientProxy.get_properties``/``ClientProxy.fit``. On the client,
:func:`importance_client_fn` wraps your own ``client_fn`` so that your
``NumPyClient`` answers them (MD, clustered sampling, OCS, AOCS,
Power-of-Choice: :mod:`flwr_importance.clientapps.numpy_client`), and
:func:`handler_client_fn` serves every method with the ready-made Message-API
handlers of :mod:`flwr_importance.clientapps`
(:mod:`flwr_importance.clientapps.legacy`). Both are client code, in the
client package; they are exported here, loaded on first use, so that a legacy
project imports its whole API from one place. :class:`SecureAOCSWorkflow` runs AOCS with
every client quantity behind Flower's SecAgg+ (docs/privacy.md).

Each class takes Flower's legacy ``FedAvg`` arguments that can apply to its
method, as ``FedAvg`` does (:class:`LegacyOptions` lists them and what each
becomes; they may also be bundled as ``legacy=LegacyOptions(...)``)::

    strategy = compat.ISFedAvg(
        clients_per_round=5,  # replaces fraction_fit / min_fit_clients
        min_available_clients=10,
        initial_parameters=ndarrays_to_parameters(initial_weights),
        evaluate_fn=evaluate_fn,
        on_fit_config_fn=lambda server_round: {"lr": 0.05},
        fraction_evaluate=0.5,
        evaluate_metrics_aggregation_fn=weighted_average,
    )

An argument that cannot apply (``fraction_fit``, ``min_fit_clients``,
``inplace``; FedSampling's federated evaluation) raises at construction,
naming what replaces it.

A method declared in :mod:`flwr_importance.registry` without a hand-written
class here (``compat.MDSampling``, ``compat.ClusteredSampling`` ...) gets a
generated one, under its Message-API class name: :func:`legacy_class` wraps any
registry strategy, the legacy transport carrying its queries, and each is
assigned below by name, so that IDEs and type checkers see it.

The server side imports no ML framework, and neither does
:func:`importance_client_fn` (your client brings its own); the ready-made
client side (:mod:`flwr_importance.clientapps.legacy`, torch) loads only when
:class:`HandlerClient` or :func:`handler_client_fn` is first used, so a
TensorFlow, JAX or scikit-learn project can run these strategies without
torch. Both client modules load on first use, keeping a ServerApp's import
light and the server package free of client code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from flwr_importance.compat.adapter import (
    LegacyOptions,
    LegacyStrategyAdapter,
    legacy_class,
)
from flwr_importance.compat.fedsampling import FedSampling
from flwr_importance.compat.folb import FOLB
from flwr_importance.compat.isfedavg import ISFedAvg
from flwr_importance.compat.ocs import OptimalClientSampling
from flwr_importance.compat.secure_aocs import SecureAOCSWorkflow

if TYPE_CHECKING:
    from flwr_importance.clientapps.legacy import HandlerClient, handler_client_fn
    from flwr_importance.clientapps.numpy_client import (
        ImportanceClient,
        importance_client_fn,
    )

#: Client-side names by module, imported on first use: ``clientapps.legacy``
#: needs torch, and neither module is any use to a ServerApp.
_CLIENT_SIDE = {
    "HandlerClient": "flwr_importance.clientapps.legacy",
    "handler_client_fn": "flwr_importance.clientapps.legacy",
    "ImportanceClient": "flwr_importance.clientapps.numpy_client",
    "importance_client_fn": "flwr_importance.clientapps.numpy_client",
}


# The generated legacy classes, one per registry method without a hand-written
# class (tests/packaging/test_static_names.py checks that none is missing).
ClusteredSampling = legacy_class("clustered")
MDSampling = legacy_class("md")
PowerOfChoice = legacy_class("power-of-choice")


def __getattr__(name: str) -> Any:
    """Load the client-side names on first use.

    PEP 562: a name not defined here is a client-side name, loaded with its
    module.
    """
    if name in _CLIENT_SIDE:
        module = importlib.import_module(_CLIENT_SIDE[name])
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FOLB",
    "ClusteredSampling",
    "FedSampling",
    "HandlerClient",
    "ISFedAvg",
    "ImportanceClient",
    "LegacyOptions",
    "LegacyStrategyAdapter",
    "MDSampling",
    "OptimalClientSampling",
    "PowerOfChoice",
    "SecureAOCSWorkflow",
    "handler_client_fn",
    "importance_client_fn",
    "legacy_class",
]
