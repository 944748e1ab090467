"""The learning problem of the example: the offline 8x8 digits, an MLP."""

from __future__ import annotations

from flwr.app import Context, UserConfig

from flwr_importance.clientapps import LocalTask
from flwr_importance.tasks import FederatedSplit, Objective, build_model, load_dataset


def digits(run_config: UserConfig, num_partitions: int) -> FederatedSplit:
    """The digits split over ``num_partitions`` clients (memoized by the loader)."""
    return load_dataset(
        "digits",
        num_partitions,
        partitioning=str(run_config["partitioning"]),
        seed=int(run_config["seed"]),
    )


def model_for(run_config: UserConfig, data: FederatedSplit) -> LocalTask:
    """The run's MLP and objective on the pooled test set (the server's view)."""
    return LocalTask(
        model=build_model(
            "mlp", data.input_shape, data.num_outputs, int(run_config["seed"])
        ),
        objective=Objective(data.task),
        x=data.test.x,
        y=data.test.y,
        lr=float(run_config["local-lr"]),
        batch_size=int(run_config["batch-size"]),
        local_steps=int(run_config["local-steps"]),
        seed=int(run_config["seed"]),
    )


def local_task(context: Context) -> LocalTask:
    """The ``TaskFactory`` of the clients: this node's partition of the digits.

    Its seed depends on the partition only, so a node keeps the same samples
    in a run with SecAgg+ and in one without.
    """
    partition_id = int(context.node_config["partition-id"])
    data = digits(context.run_config, int(context.node_config["num-partitions"]))
    task = model_for(context.run_config, data)
    task.x = data.partitions[partition_id].x
    task.y = data.partitions[partition_id].y
    task.seed = int(context.run_config["seed"]) * 1000 + partition_id
    return task
