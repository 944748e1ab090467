"""``strategy = "fedprox"``: Flower's own FedProx, ``mu`` from ``proximal-mu``."""

from __future__ import annotations

from flwr.serverapp.strategy import FedProx

from simulations.config import ExperimentConfig
from simulations.methods import uniform_sampling
from simulations.methods.fedavg import client_handlers

__all__ = ["build_strategy", "client_handlers"]


def build_strategy(config: ExperimentConfig, num_clients: int) -> FedProx:
    """Flower's ``FedProx``; its clients add ``(mu/2)||w - w_global||^2``."""
    return FedProx(
        proximal_mu=config.proximal_mu, **uniform_sampling(config, num_clients)
    )
