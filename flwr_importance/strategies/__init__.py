"""Flower Message-API strategies, one module per paper.

Each is a subclass of Flower's ``flwr.serverapp.strategy.FedAvg``: sampling in
``configure_train``, reweighted aggregation in ``aggregate_train``. Each class
docstring states its paper, its parameters and its client contract. Any of
them takes a server optimizer (``server_optimizer=ServerAdam()``, re-exported
here from :mod:`flwr_importance.aggregation.server_optimizers`), and
:class:`CentralDP` wraps the ones it can prove private (docs/privacy.md), as
Flower keeps its DP wrappers beside ``FedAvg``.
"""

from flwr_importance.aggregation.server_optimizers import (
    ServerAdagrad,
    ServerAdam,
    ServerMomentum,
    ServerOptimizer,
    ServerYogi,
)
from flwr_importance.strategies.clustered import ClusteredSampling
from flwr_importance.strategies.fedsampling import FedSampling
from flwr_importance.strategies.folb import FOLB
from flwr_importance.strategies.isfedavg import ISFedAvg
from flwr_importance.strategies.md import MDSampling
from flwr_importance.strategies.mmfl import (
    MultiModelSampling,
    evaluate_every_model,
    pack_models,
    per_model_files,
    unpack_models,
)
from flwr_importance.strategies.ocs import OptimalClientSampling
from flwr_importance.strategies.power_of_choice import PowerOfChoice
from flwr_importance.strategies.replies import (
    ClientSideFailedError,
    ClientSideMissingError,
)
from flwr_importance.strategies.wrappers.central_dp import (
    DP_DELTA_METRIC,
    DP_EPSILON_METRIC,
    CentralDP,
)

__all__ = [
    "DP_DELTA_METRIC",
    "DP_EPSILON_METRIC",
    "FOLB",
    "CentralDP",
    "ClientSideFailedError",
    "ClientSideMissingError",
    "ClusteredSampling",
    "FedSampling",
    "ISFedAvg",
    "MDSampling",
    "MultiModelSampling",
    "OptimalClientSampling",
    "PowerOfChoice",
    "ServerAdagrad",
    "ServerAdam",
    "ServerMomentum",
    "ServerOptimizer",
    "ServerYogi",
    "evaluate_every_model",
    "pack_models",
    "per_model_files",
    "unpack_models",
]
