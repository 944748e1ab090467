"""The simulation's learning problem, built from the run config on either side."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context

from flwr_importance.clientapps import LocalTask
from flwr_importance.tasks import (
    TASK_KINDS,
    ClientData,
    FederatedSplit,
    Objective,
    TaskKind,
    build_model,
    load_dataset,
)
from simulations.config import ExperimentConfig

#: Prefix of the ``context.state`` records that keep a node's partition.
NODE_DATA_PREFIX = "simulations.node-data."


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


class DataShapes(Protocol):
    """The shapes a model is built for.

    A :class:`FederatedSplit` or a :class:`NodeData`.
    """

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input sample."""

    @property
    def num_outputs(self) -> int:
        """Number of classes, or of regression targets."""


def global_model(config: ExperimentConfig, data: DataShapes) -> torch.nn.Module:
    """The run's model, initialized from the run's seed."""
    return build_model(config.model, data.input_shape, data.num_outputs, config.seed)


@dataclass(frozen=True)
class NodeData:
    """What a node's ClientApp needs of the run's data set.

    Attributes
    ----------
    partition : ClientData
        The node's training samples.
    task : {"classification", "regression"}
        The data set's task.
    input_shape : tuple of int
        Shape of one input sample.
    num_outputs : int
        Number of classes, or of regression targets.
    """

    partition: ClientData
    task: TaskKind
    input_shape: tuple[int, ...]
    num_outputs: int


def node_data(context: Context) -> NodeData:
    """The node's partition of the run's data set, kept in ``context.state``.

    The deployment engine starts a ClientApp process per message, and building
    a split costs more than the rest of a message (the digits: scikit-learn, HF
    ``datasets`` and ``flwr_datasets`` imports and the partitioners, ~3 s).
    The first message of a run builds it and keeps the node's own partition in
    the node's state, which Flower hands to every later message of the run; a
    new run starts from an empty state, so a kept partition is never stale.
    The key covers the whole run and node config (MMFL's models each have
    their own), and the arrays come back bit for bit.
    """
    key = NODE_DATA_PREFIX + _config_digest(context)
    arrays_key, info_key = f"{key}.arrays", f"{key}.info"
    if arrays_key in context.state and info_key in context.state:
        arrays = context.state.array_records[arrays_key]
        info = context.state.config_records[info_key]
        task = str(info["task"])
        if task not in TASK_KINDS:
            raise ValueError(f"kept node data has unknown task {task!r}")
        return NodeData(
            partition=ClientData(
                torch.from_numpy(arrays["x"].numpy()),
                torch.from_numpy(arrays["y"].numpy()),
            ),
            task=task,
            input_shape=tuple(cast(list[int], info["input-shape"])),
            num_outputs=cast(int, info["num-outputs"]),
        )
    config = ExperimentConfig.from_run_config(context.run_config)
    split = federated_data(config, int(context.node_config["num-partitions"]))
    data = NodeData(
        partition=split.partitions[int(context.node_config["partition-id"])],
        task=split.task,
        input_shape=split.input_shape,
        num_outputs=split.num_outputs,
    )
    context.state[arrays_key] = ArrayRecord(
        {
            "x": Array(data.partition.x.numpy()),
            "y": Array(data.partition.y.numpy()),
        }
    )
    context.state[info_key] = ConfigRecord(
        {
            "task": data.task,
            "input-shape": list(data.input_shape),
            "num-outputs": data.num_outputs,
        }
    )
    return data


def _config_digest(context: Context) -> str:
    """A digest of everything a node's data depends on: run and node config."""
    settings = json.dumps(
        [dict(context.run_config), dict(context.node_config)], sort_keys=True
    )
    return hashlib.sha256(settings.encode()).hexdigest()[:16]


def local_task(context: Context) -> LocalTask:
    """The ``TaskFactory`` of the simulation's ClientApp: this node's partition."""
    config = ExperimentConfig.from_run_config(context.run_config)
    partition_id = int(context.node_config["partition-id"])
    data = node_data(context)
    node_seed = np.random.SeedSequence([config.seed, partition_id]).generate_state(1)
    return LocalTask(
        model=global_model(config, data),
        objective=Objective(data.task, l2=config.l2),
        x=data.partition.x,
        y=data.partition.y,
        lr=config.local_lr,
        batch_size=config.batch_size,
        local_steps=config.local_steps or None,
        epochs=config.local_epochs or None,
        heterogeneous_steps=config.heterogeneous_steps,
        seed=int(node_seed[0]),
    )
