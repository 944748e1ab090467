"""Torch models, local training, per-sample gradients and offline federated data.

Everything a ClientApp needs to train and evaluate locally, independent of Flower:
models (:mod:`.models`), losses and local SGD with the FedProx term
(:mod:`.training`), and data sets split over clients (:mod:`.data`).
"""

from flwr_importance.tasks.data import (
    DATASET_NAMES,
    HUB_DATASET_NAMES,
    ClientData,
    FederatedSplit,
    load_dataset,
    load_hub_dataset,
)
from flwr_importance.tasks.models import MODEL_NAMES, build_model
from flwr_importance.tasks.partitioning import PARTITIONINGS, partition_indices
from flwr_importance.tasks.training import (
    TASK_KINDS,
    Objective,
    TaskKind,
    WeightedStep,
    evaluate,
    full_gradient,
    get_weights,
    random_local_steps,
    set_weights,
    train_local,
    weighted_sgd_step,
)

__all__ = [
    "DATASET_NAMES",
    "HUB_DATASET_NAMES",
    "MODEL_NAMES",
    "PARTITIONINGS",
    "TASK_KINDS",
    "ClientData",
    "FederatedSplit",
    "Objective",
    "TaskKind",
    "WeightedStep",
    "build_model",
    "evaluate",
    "full_gradient",
    "get_weights",
    "load_dataset",
    "load_hub_dataset",
    "partition_indices",
    "random_local_steps",
    "set_weights",
    "train_local",
    "weighted_sgd_step",
]
