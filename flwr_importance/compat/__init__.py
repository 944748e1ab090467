"""The library's strategies on Flower's legacy Strategy API (``configure_fit``).

For projects built on ``ServerApp(server_fn=...)`` returning
``ServerAppComponents(strategy=...)`` with ``NumPyClient`` clients. Each class
subclasses ``flwr.server.strategy.FedAvg`` and runs the Message-API strategy of
the same name (:mod:`flwr_importance.strategies`), so both APIs share every
line of sampling and aggregation; :mod:`.transport` carries the extra round
trips over ``ClientProxy.get_properties``/``ClientProxy.fit`` and
:func:`handler_client_fn` serves them on the client with the Message-API
handlers of :mod:`flwr_importance.clientapps`.
"""

from flwr_importance.compat.adapter import LegacyOptions, LegacyStrategyAdapter
from flwr_importance.compat.clients import HandlerClient, handler_client_fn
from flwr_importance.compat.clustered import ClusteredSampling
from flwr_importance.compat.fedsampling import FedSampling
from flwr_importance.compat.folb import FOLB
from flwr_importance.compat.isfedavg import ISFedAvg
from flwr_importance.compat.md import MDSampling
from flwr_importance.compat.ocs import OptimalClientSampling

__all__ = [
    "FOLB",
    "ClusteredSampling",
    "FedSampling",
    "HandlerClient",
    "ISFedAvg",
    "LegacyOptions",
    "LegacyStrategyAdapter",
    "MDSampling",
    "OptimalClientSampling",
    "handler_client_fn",
]
