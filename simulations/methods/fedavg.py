"""``strategy = "fedavg"``: Flower's own FedAvg, the uniform-sampling baseline."""

from __future__ import annotations

from flwr.serverapp.strategy import FedAvg

from flwr_importance.clientapps import (
    ClientHandler,
    TaskFactory,
    make_evaluate_handler,
    make_train_handler,
)
from simulations.config import ExperimentConfig
from simulations.methods import uniform_sampling


def build_strategy(config: ExperimentConfig, num_clients: int) -> FedAvg:
    """Flower's ``FedAvg`` sampling ``clients-per-round`` nodes uniformly."""
    return FedAvg(**uniform_sampling(config, num_clients))


def client_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """Plain local SGD and local evaluation."""
    return {
        "train": make_train_handler(task_factory),
        "evaluate": make_evaluate_handler(task_factory),
    }
