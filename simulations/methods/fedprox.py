"""``strategy = "fedprox"``: FedProx, ``mu`` from ``proximal-mu``, on shared draws.

Like the simulation's FedAvg (:mod:`simulations.methods.fedavg`), the
benchmark's common-random-numbers baseline: Flower's ``FedProx`` choosing its
nodes with :func:`flwr_importance.sampling.uniform_client_set`.
"""

from __future__ import annotations

from typing import Any

from flwr.serverapp.strategy import FedProx

from flwr_importance.aggregation.server_optimizers import (
    ServerOptimizer,
    check_server_optimizer,
)
from simulations.config import ExperimentConfig
from simulations.methods import uniform_sampling
from simulations.methods.fedavg import ScheduledFedAvg, client_handlers

__all__ = ["ScheduledFedProx", "build_strategy", "client_handlers"]


class ScheduledFedProx(FedProx, ScheduledFedAvg):
    """Flower's ``FedProx`` choosing its nodes as :class:`ScheduledFedAvg` does.

    ``FedProx.configure_train`` adds ``proximal-mu`` to the config and hands
    over to :meth:`ScheduledFedAvg.configure_train`, next in the method order;
    its ``aggregate_train`` (FedAvg's average, then the server optimizer's
    step) is :class:`ScheduledFedAvg`'s.

    Parameters
    ----------
    seed : int
        Seeds the node draws (>= 0), with the round.
    server_optimizer : ServerOptimizer or None
        The server optimizer; None: FedAvg's model replacement.
    **kwargs
        Flower's ``FedProx`` arguments.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        server_optimizer: ServerOptimizer | None = None,
        **kwargs: Any,
    ) -> None:
        # FedProx's constructor reaches ScheduledFedAvg's without these two.
        super().__init__(**kwargs)
        self.seed = seed
        self.server_optimizer = check_server_optimizer(server_optimizer)


def build_strategy(config: ExperimentConfig, num_clients: int) -> ScheduledFedProx:
    """``FedProx``; its clients add ``(mu/2)||w - w_global||^2``."""
    return ScheduledFedProx(
        seed=config.seed,
        server_optimizer=config.server_optimizer(),
        proximal_mu=config.proximal_mu,
        **uniform_sampling(config, num_clients),
    )
