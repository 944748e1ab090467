"""FedSampling and the size-weighted baseline, driven through the in-process grid.

The real strategies run against the real ClientApp handlers; every message
crosses the (simulated) wire as protobuf.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from flwr_importance.clientapps import LocalTask, TaskFactory
from flwr_importance.clientapps.fedsampling import (
    UNSAFE_REPRODUCIBLE_COINS_KEY,
    make_fedsampling_train_handler,
    make_size_query_handler,
)
from flwr_importance.sampling.fedsampling import (
    binomial_upper_tail,
    epsilon_for_usable_estimate,
    nodes_for_usable_estimate,
    size_estimate_noise,
)
from flwr_importance.sampling.privacy import (
    estimate_total_size,
    ldp_alpha,
    privatize_size,
    size_reply_probabilities,
)
from flwr_importance.strategies.fedsampling import FedSampling
from flwr_importance.tasks import Objective
from flwr_importance.tooling.testing import InProcessGrid
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
        # The nodes' epsilon cap: above every epsilon these tests' servers ask.
        "fedsampling-epsilon": 1000.0,
    }
)


@dataclass(frozen=True)
class CountingObjective(Objective):
    """An objective that records how many samples each gradient is taken over."""

    batch_sizes: list[int] = field(default_factory=list, compare=False)

    def loss(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):  # type: ignore[no-untyped-def]
        self.batch_sizes.append(len(x))
        return super().loss(model, x, y)


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
    strategy = FedSampling(
        samples_per_round=16, max_size=max_size, epsilon=epsilon, min_available_nodes=1
    )
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
    strategy = FedSampling(
        samples_per_round=16,
        max_size=max(sizes.values()) + 2,
        epsilon=60.0,
        min_available_nodes=1,
    )
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
        samples_per_round=samples_per_round,
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


def fixed_size_reply_app(response: int) -> ClientApp:
    """Every node answers the size query with ``response``."""
    app = ClientApp()

    @app.query("sizes")
    def answer(message: Message, context: Context) -> Message:
        content = RecordDict({"metrics": MetricRecord({"size-response": response})})
        return Message(content, reply_to=message)

    return app


def test_federated_evaluation_is_refused_with_the_reason_and_the_way_out() -> None:
    with pytest.raises(ValueError, match=r"fraction_evaluate=0\.5") as raised:
        FedSampling(samples_per_round=16, fraction_evaluate=0.5)
    assert "reveals each node's size" in str(raised.value)
    assert "evaluate_fn" in str(raised.value)


def test_estimate_below_k_says_its_noise_and_what_makes_it_usable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Every reply 1: the estimate (sum - (1 - alpha) M C / 2) / alpha < 0 < K.
    num_nodes, max_size, epsilon = 10, 100, 3.0
    grid = InProcessGrid(fixed_size_reply_app(1), num_nodes)
    strategy = FedSampling(
        samples_per_round=64, max_size=max_size, epsilon=epsilon, min_available_nodes=1
    )
    with caplog.at_level(logging.WARNING):
        (metrics,) = estimate_only(strategy, grid, 1)
    assert metrics["raw-size-estimate"] < 64 == metrics["estimated-total-size"]
    noise = size_estimate_noise(num_nodes, max_size, strategy.alpha)
    nodes = nodes_for_usable_estimate(max_size, strategy.alpha)
    needed_epsilon = epsilon_for_usable_estimate(num_nodes, max_size)
    assert "below K=64" in caplog.text
    assert "M/alpha * sqrt(C (1-alpha) (1/12 + alpha/4))" in caplog.text
    assert f"= {noise:.0f} samples" in caplog.text
    assert f"from about {nodes} nodes" in caplog.text
    assert f"epsilon={needed_epsilon:.1f} with {num_nodes} nodes" in caplog.text
    # At M = 100, epsilon = 3, ten nodes are far too few (docs/methods.md's numbers).
    assert nodes == 37 and 3.8 < needed_epsilon < 3.9


def test_usable_thresholds_agree_with_each_other() -> None:
    for num_nodes, max_size in ((10, 100), (50, 1000), (400, 30)):
        epsilon = epsilon_for_usable_estimate(num_nodes, max_size)
        alpha = ldp_alpha(epsilon, max_size)
        assert nodes_for_usable_estimate(max_size, alpha) == num_nodes
        # A slightly smaller epsilon needs more nodes.
        assert (
            nodes_for_usable_estimate(max_size, ldp_alpha(0.95 * epsilon, max_size))
            > num_nodes
        )


@pytest.mark.parametrize(("epsilon", "size"), [(0.5, 1), (3.0, 40), (8.0, 99)])
def test_size_estimate_noise_bounds_the_estimates_spread(
    epsilon: float, size: int
) -> None:
    num_nodes, max_size, trials = 20, 100, 4000
    rng = np.random.default_rng(0)
    estimates = [
        estimate_total_size(
            [privatize_size(size, max_size, epsilon, rng) for _ in range(num_nodes)],
            max_size,
            epsilon,
        )
        for _ in range(trials)
    ]
    bound = size_estimate_noise(num_nodes, max_size, ldp_alpha(epsilon, max_size))
    spread = float(np.std(estimates))
    # A bound, and a tight one: the worst case |n - M/2| = M/2 is near size 1.
    assert spread <= 1.05 * bound
    assert spread >= 0.5 * bound


def test_replies_piling_at_the_top_warn_that_max_size_clips(
    caplog: pytest.LogCaptureFixture,
) -> None:
    max_size = 50
    grid = InProcessGrid(fixed_size_reply_app(max_size - 1), 8)
    strategy = FedSampling(
        samples_per_round=16, max_size=max_size, epsilon=3.0, min_available_nodes=1
    )
    with caplog.at_level(logging.WARNING):
        estimate_only(strategy, grid, 1)
    assert f"8 of 8 size replies are M-1={max_size - 1}" in caplog.text
    assert "about 100% of the nodes hold M-1 samples or more" in caplog.text
    assert "set max_size (50) above the largest partition" in caplog.text


def test_sizes_below_max_size_do_not_warn_of_clipping(
    caplog: pytest.LogCaptureFixture,
) -> None:
    num_nodes = 15
    # The warning's false alarms are about one round in 1,000
    # (CLIPPING_SIGNIFICANCE): with the nodes' own coins, 20 rounds would
    # warn in about 2% of runs. The grid's seed fixes the coins.
    run_config = {**RUN_CONFIG, UNSAFE_REPRODUCIBLE_COINS_KEY: True}
    grid = InProcessGrid(simulation_client_app, num_nodes, run_config, seed=1)
    max_size = max(true_sizes(grid, num_nodes).values()) + 2
    strategy = FedSampling(
        samples_per_round=16, max_size=max_size, epsilon=3.0, min_available_nodes=1
    )
    with caplog.at_level(logging.WARNING):
        estimate_only(strategy, grid, 20)
    assert "size replies are M-1" not in caplog.text


def test_binomial_upper_tail_matches_the_sum_of_the_pmf() -> None:
    trials, probability = 12, 0.2
    pmf = [
        math.comb(trials, count)
        * probability**count
        * (1 - probability) ** (trials - count)
        for count in range(trials + 1)
    ]
    for successes in (0, 1, 3, 12):
        assert binomial_upper_tail(successes, trials, probability) == pytest.approx(
            sum(pmf[successes:])
        )
