"""What is specific to the ISFedAvg benchmark: eqs. 26-27 and its matched FedAvg."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.clientapp import ClientApp

from benchmarks.isfedavg import (
    BATCH_SIZE,
    LEARNING_RATE,
    LOCAL_STEPS,
    MatchedFedAvg,
    TrueProbabilityISFedAvg,
    optimal_client_probs,
    optimal_sample_probs,
)
from flwr_importance.protocol import ISFEDAVG_BATCH_SIZE, ISFEDAVG_LOCAL_STEPS
from flwr_importance.strategies.isfedavg import ISFedAvg
from flwr_importance.tooling.testing import InProcessGrid

NUM_NODES = 12
SEED = 7


def test_eqs_26_27_on_a_tiny_case() -> None:
    # Client 0: norms (1, 3), E = 2, B = 1 -> p_n = (1/4, 3/4) (eq. 26);
    # sigma2 = 6 / (2 * 1 * 2^2) * (1 / (1/4) + 9 / (3/4)) = 12 (eq. 22);
    # alpha = 3 + 6 / 2 = 6, ||grad P||^2 = 4 -> importance sqrt(12 + 24) = 6.
    # Client 1: norm (2,), E = B = 1 -> sigma2 = 6 * 4 = 24, alpha = 9,
    # ||grad P||^2 = 1 -> importance sqrt(33). Eq. 27 normalizes.
    probs = optimal_client_probs(
        [np.array([1.0, 3.0]), np.array([2.0])],
        [4.0, 1.0],
        [2, 1],
        [1, 1],
        min_relative_client_prob=0.0,
        min_relative_sample_prob=0.0,
    )
    np.testing.assert_allclose(probs, np.array([6.0, math.sqrt(33)]) / (6 + 33**0.5))
    np.testing.assert_allclose(
        optimal_sample_probs(np.array([1.0, 3.0]), 0.0), [0.25, 0.75]
    )


def test_eq_22_uses_the_capped_batch_probabilities() -> None:
    # B = 2 of 2 samples: both are always drawn, realized p_n = (1/2, 1/2), so
    # sigma2 = 6 / (1 * 2 * 4) * (1 / 0.5 + 9 / 0.5) = 15; importance
    # sqrt(15 + (3 + 3) * 0) against client 1's sqrt(24 + 0) = sqrt(24).
    probs = optimal_client_probs(
        [np.array([1.0, 3.0]), np.array([2.0])],
        [0.0, 0.0],
        [1, 1],
        [2, 1],
        min_relative_client_prob=0.0,
        min_relative_sample_prob=0.0,
    )
    np.testing.assert_allclose(
        probs, np.array([15**0.5, 24**0.5]) / (15**0.5 + 24**0.5)
    )


def test_a_sample_with_no_gradient_keeps_the_floor() -> None:
    # Without the floor eq. 26 gives it 0, and 1 / (N p_n) would be infinite.
    probs = optimal_sample_probs(np.array([0.0, 1.0, 1.0, 1.0]), 0.4)
    assert 0 < probs[0] < probs[1]
    assert probs.sum() == pytest.approx(1.0)


def _grid() -> InProcessGrid:
    return InProcessGrid(ClientApp(), NUM_NODES, {}, seed=SEED)


def _config_int(message: Message, key: str) -> int:
    value = message.content.config_records["config"][key]
    assert isinstance(value, int)
    return value


def _arrays() -> ArrayRecord:
    return ArrayRecord(torch.nn.Linear(2, 1).state_dict())


def test_matched_fedavg_gets_isfedavgs_local_work_per_node() -> None:
    grid = _grid()
    isfedavg = ISFedAvg(clients_per_round=4, seed=SEED, min_available_nodes=4)
    drawn: dict[int, tuple[int, int]] = {}
    for server_round in range(1, 6):
        for message in isfedavg.configure_train(
            server_round, _arrays(), ConfigRecord(), grid
        ):
            drawn[message.metadata.dst_node_id] = (
                _config_int(message, ISFEDAVG_LOCAL_STEPS),
                _config_int(message, ISFEDAVG_BATCH_SIZE),
            )
    matched = MatchedFedAvg(
        local_work=ISFedAvg(clients_per_round=4, seed=SEED),
        lr=0.3,
        divide_by_local_steps=True,
        fraction_train=4 / NUM_NODES,
        min_train_nodes=4,
        min_available_nodes=4,
        fraction_evaluate=0.0,
    )
    compared = 0
    for server_round in range(1, 6):
        for message in matched.configure_train(
            server_round, _arrays(), ConfigRecord(), grid
        ):
            node = message.metadata.dst_node_id
            steps = _config_int(message, LOCAL_STEPS)
            batch = _config_int(message, BATCH_SIZE)
            learning_rate = message.content.config_records["config"][LEARNING_RATE]
            assert learning_rate == pytest.approx(0.3 / steps)
            if node in drawn:
                assert (steps, batch) == drawn[node]
                compared += 1
    # 5 rounds of 4 nodes from 12 on each side: most nodes meet on both.
    assert compared >= 10
    assert len({steps for steps, _ in drawn.values()}) > 1


def test_true_probability_strategy_sends_eq_27() -> None:
    grid = _grid()
    nodes = sorted(grid.get_node_ids())
    rng = np.random.default_rng(0)
    norms = [rng.uniform(0.1, 2.0, 5) for _ in range(NUM_NODES)]
    sq_norms = rng.uniform(0.0, 1.0, NUM_NODES).tolist()
    strategy = TrueProbabilityISFedAvg(
        grad_norms=norms,
        gradient_sq_norms=sq_norms,
        partition_of=grid.partition_of,
        clients_per_round=3,
        seed=SEED,
        min_available_nodes=3,
    )
    for server_round in (1, 2):
        strategy.configure_train(server_round, _arrays(), ConfigRecord(), grid)
        parts = [grid.partition_of(node) for node in nodes]
        expected = optimal_client_probs(
            [norms[part] for part in parts],
            [sq_norms[part] for part in parts],
            [strategy.local_steps[node] for node in nodes],
            [strategy.batch_sizes[node] for node in nodes],
            min_relative_client_prob=strategy.min_relative_client_prob,
            min_relative_sample_prob=strategy.min_relative_sample_prob,
        )
        np.testing.assert_allclose(strategy.probability_vector(nodes), expected)
