"""The simulation's learning problem, built from the run config on either side."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Context

from flwr_importance.clientapps import LocalTask
from flwr_importance.tasks import FederatedSplit, Objective, build_model, load_dataset
from simulations.config import ExperimentConfig


def federated_data(config: ExperimentConfig, num_partitions: int) -> FederatedSplit:
    """The run's dataset split over ``num_partitions`` clients (memoized)."""
    return load_dataset(
        config.dataset,
        num_partitions,
        partitioning=config.partitioning,
        seed=config.seed,
        classes_per_client=config.classes_per_client,
        dirichlet_alpha=config.dirichlet_alpha,
        lognormal_sigma=config.lognormal_sigma,
        samples_per_client=config.samples_per_client,
    )


def global_model(config: ExperimentConfig, data: FederatedSplit) -> torch.nn.Module:
    """The run's model, initialized from the run's seed."""
    return build_model(config.model, data.input_shape, data.num_outputs, config.seed)


def local_task(context: Context) -> LocalTask:
    """The ``TaskFactory`` of the simulation's ClientApp: this node's partition."""
    config = ExperimentConfig.from_run_config(context.run_config)
    partition_id = int(context.node_config["partition-id"])
    data = federated_data(config, int(context.node_config["num-partitions"]))
    partition = data.partitions[partition_id]
    node_seed = np.random.SeedSequence([config.seed, partition_id]).generate_state(1)
    return LocalTask(
        model=global_model(config, data),
        objective=Objective(data.task, l2=config.l2),
        x=partition.x,
        y=partition.y,
        lr=config.local_lr,
        batch_size=config.batch_size,
        local_steps=config.local_steps or None,
        epochs=config.local_epochs or None,
        heterogeneous_steps=config.heterogeneous_steps,
        seed=int(node_seed[0]),
    )
