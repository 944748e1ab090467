"""``strategy = "sizeweighted"``: clients drawn proportionally to their TRUE size.

FedSampling's client-level baseline; it reveals every node's size to the server.
"""

from __future__ import annotations

from flwr_importance.clientapps import (
    ClientHandler,
    TaskFactory,
    make_evaluate_handler,
    make_train_handler,
)
from flwr_importance.clientapps.sizes import make_sizes_handler
from flwr_importance.strategies.size_weighted import SizeWeightedSampling
from simulations.config import ExperimentConfig


def build_strategy(config: ExperimentConfig, num_clients: int) -> SizeWeightedSampling:
    """``clients-per-round`` draws per round, seeded by ``seed``."""
    return SizeWeightedSampling(
        clients_per_round=config.clients_per_round,
        seed=config.seed,
        min_available_nodes=1,
    )


def client_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """True size reply, plain local SGD, local evaluation."""
    return {
        "query.sizes": make_sizes_handler(task_factory),
        "train": make_train_handler(task_factory),
        "evaluate": make_evaluate_handler(task_factory),
    }
