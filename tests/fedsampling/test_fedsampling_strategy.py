"""FedSampling and the size-weighted baseline, driven through the in-process grid.

The real strategies run against the real ClientApp handlers; every message
crosses the (simulated) wire as protobuf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    MetricRecord,
)
from flwr.clientapp import ClientApp

from flwr_importance.clientapps import LocalTask, TaskFactory
from flwr_importance.clientapps.fedsampling import (
    make_fedsampling_train_handler,
    make_size_query_handler,
)
from flwr_importance.sampling import size_reply_probabilities
from flwr_importance.strategies.fedsampling import FedSampling
from flwr_importance.tasks import Objective
from flwr_importance.testing import InProcessGrid
from simulations.client_app import app as simulation_client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.task import federated_data, global_model, local_task

RUN_CONFIG = resolve_run_config(
    {
        "strategy": "fedsampling",
        "dataset": "digits",
        "partitioning": "lognormal",
        "lognormal-sigma": 1.0,
        "model": "logreg",
    }
)


@dataclass(frozen=True)
class CountingObjective(Objective):
    """An objective that records how many samples each gradient is taken over."""

    batch_sizes: list[int] = field(default_factory=list, compare=False)

    def sample_losses(self, outputs: torch.Tensor, targets: torch.Tensor):  # type: ignore[no-untyped-def]
        self.batch_sizes.append(len(targets))
        return super().sample_losses(outputs, targets)


def fedsampling_app(task_factory: TaskFactory) -> ClientApp:
    app = ClientApp()
    app.query("sizes")(make_size_query_handler(task_factory))
    app.train()(make_fedsampling_train_handler(task_factory))
    return app


def initial_arrays(run_config: dict) -> ArrayRecord:  # type: ignore[type-arg]
    config = ExperimentConfig.from_run_config(run_config)
    return ArrayRecord(global_model(config, federated_data(config, 1)).state_dict())


def true_sizes(grid: InProcessGrid, num_nodes: int) -> dict[int, int]:
    config = ExperimentConfig.from_run_config(RUN_CONFIG)
    sizes = federated_data(config, num_nodes).partition_sizes
    return {node: int(sizes[grid.partition_of(node)]) for node in grid.get_node_ids()}


def estimate_only(strategy: FedSampling, grid: InProcessGrid, rounds: int) -> list:  # type: ignore[type-arg]
    """Size query and estimate for ``rounds`` rounds, without training."""
    arrays = ArrayRecord([np.zeros(1)])
    metrics = []
    for server_round in range(1, rounds + 1):
        strategy.configure_train(server_round, arrays, ConfigRecord(), grid)
        _, round_metrics = strategy.aggregate_train(server_round, [])
        metrics.append(round_metrics)
    return metrics


def test_size_estimate_is_unbiased_over_rounds() -> None:
    num_nodes, rounds, max_size, epsilon = 12, 150, 100, 3.0
    grid = InProcessGrid(simulation_client_app, num_nodes, RUN_CONFIG, seed=0)
    strategy = FedSampling(16, max_size, epsilon, min_available_nodes=1)
    estimates = np.array(
        [m["raw-size-estimate"] for m in estimate_only(strategy, grid, rounds)]
    )
    sizes = true_sizes(grid, num_nodes).values()
    clipped = [min(max(size, 1), max_size - 1) for size in sizes]
    # Exact variance of one round's estimate: sum of the reply variances / alpha^2.
    replies = np.arange(1, max_size)
    variance = 0.0
    for size in clipped:
        probabilities = size_reply_probabilities(size, max_size, epsilon)
        mean = probabilities @ replies
        variance += probabilities @ (replies - mean) ** 2
    variance /= strategy.alpha**2
    assert abs(estimates.mean() - sum(clipped)) < 4 * math.sqrt(variance / rounds)


def test_huge_epsilon_recovers_the_true_total() -> None:
    num_nodes = 15
    grid = InProcessGrid(simulation_client_app, num_nodes, RUN_CONFIG, seed=1)
    sizes = true_sizes(grid, num_nodes)
    # M above every size: nothing is clipped, the estimate is the true total.
    strategy = FedSampling(16, max(sizes.values()) + 2, 60.0, min_available_nodes=1)
    for metrics in estimate_only(strategy, grid, 3):
        assert metrics["raw-size-estimate"] == pytest.approx(sum(sizes.values()))
        assert metrics["num-size-replies"] == num_nodes


def counting_factory(objective: CountingObjective) -> TaskFactory:
    def factory(context: Context) -> LocalTask:
        return replace(local_task(context), objective=objective)

    return factory


def test_a_round_uses_k_samples_in_expectation() -> None:
    """Per round, kept samples have mean ``K N / N_tilde`` given the estimate."""
    num_nodes, rounds, samples_per_round = 10, 40, 48
    objective = CountingObjective("classification")
    grid = InProcessGrid(
        fedsampling_app(counting_factory(objective)), num_nodes, RUN_CONFIG, seed=2
    )
    sizes = true_sizes(grid, num_nodes)
    total, max_size = sum(sizes.values()), max(sizes.values()) + 2
    kept_per_round: list[int] = []

    def close_round(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        kept_per_round.append(sum(objective.batch_sizes))
        objective.batch_sizes.clear()
        return MetricRecord({})

    strategy = FedSampling(
        samples_per_round,
        max_size=max_size,
        epsilon=12.0,
        server_lr=0.1,
        min_available_nodes=1,
    )
    result = strategy.start(
        grid=grid,
        initial_arrays=initial_arrays(RUN_CONFIG),
        num_rounds=rounds,
        evaluate_fn=close_round,
    )
    kept = np.array(kept_per_round[1:], dtype=float)  # entry 0: before round 1
    probabilities = np.array(
        [
            samples_per_round
            / result.train_metrics_clientapp[r]["estimated-total-size"]
            for r in range(1, rounds + 1)
        ]
    )
    expected = total * probabilities
    standard_error = math.sqrt(np.sum(expected * (1 - probabilities))) / rounds
    assert abs(kept.mean() - expected.mean()) < 4 * standard_error
    # At epsilon = 12 (alpha > 0.99) the estimate is nearly exact, so the mean is K
    # itself, up to the second-order Jensen bias K Var(N_tilde) / N^2.
    relative_variance = np.var(samples_per_round / probabilities) / total**2
    jensen_bias = 2 * samples_per_round * relative_variance
    assert abs(kept.mean() - samples_per_round) < 4 * standard_error + jensen_bias
