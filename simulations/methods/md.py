"""``strategy = "md"``: MD sampling, the baseline of clustered sampling."""

from __future__ import annotations

from flwr_importance.strategies.md import MDSampling
from flwr_importance.tooling.declarations import CannedVariant, MethodTooling
from simulations.config import ExperimentConfig
from simulations.methods.clustered import client_handlers

__all__ = ["build_strategy", "client_handlers"]


def build_strategy(config: ExperimentConfig, num_clients: int) -> MDSampling:
    """``MDSampling`` drawing ``clients-per-round`` clients per round."""
    # The ServerApp evaluates centrally.
    return MDSampling(
        clients_per_round=config.clients_per_round,
        seed=config.seed,
        server_optimizer=config.server_optimizer(),
        fraction_evaluate=0.0,
    )


#: How the tests and benchmarks run the method (simulations/tooling.py).
TOOLING = MethodTooling(
    headline_preset="clustered-digits-md",
    canned=(CannedVariant(replies={"query.sizes": "sizes", "train": "model"}),),
    smoke={"partitioning": "iid"},
)
