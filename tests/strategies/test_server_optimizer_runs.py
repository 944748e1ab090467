"""Every strategy of the app under every server optimizer, in process.

The real strategies and ClientApps run through the in-process grid. A spy on
:meth:`ServerOptimizer.step` sees each round's step: one per round, each
starting from the model the previous step made (so the optimizer's model is
the one the next round trains) with the previous step's moments. Without an
optimizer nothing steps and the model is the method's own, the very object
its ``aggregate_round`` returned: the default path is today's, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord

from flwr_importance.aggregation.server_optimizers import (
    OptimizerState,
    ServerOptimizer,
)
from flwr_importance.strategies.base import ImportanceStrategy
from simulations.inprocess import run_inprocess
from simulations.methods import LIBRARY_METHODS

ROUNDS = 2
#: The library's strategies and Flower's two baselines of the app.
STRATEGIES = [*LIBRARY_METHODS, "fedavg", "fedprox"]
OPTIMIZERS = ("adam", "yogi", "adagrad", "momentum")


@dataclass
class Step:
    current: dict[str, np.ndarray]
    state_in: OptimizerState
    new_model: dict[str, np.ndarray]
    state_out: OptimizerState
    server_round: int


def run(strategy: str, optimizer: str, output_dir: Path) -> list[dict[str, float]]:
    rows, _ = run_inprocess(
        {
            "strategy": strategy,
            "partitioning": "iid",
            "num-server-rounds": ROUNDS,
            "clients-per-round": 4,
            "local-steps": 3,
            "server-optimizer": optimizer,
            "server-optimizer-eta": 0.01,
            "output-dir": str(output_dir),
        },
        num_clients=8,
    )
    return rows


@pytest.fixture
def steps(monkeypatch: pytest.MonkeyPatch) -> list[Step]:
    """Each ``ServerOptimizer.step`` of the test, in order."""
    calls: list[Step] = []
    original = ServerOptimizer.step

    def spy(
        self: ServerOptimizer,
        current: Any,
        aggregated: Any,
        state: OptimizerState,
        server_round: int,
    ) -> Any:
        new_model, new_state = original(self, current, aggregated, state, server_round)
        copied = {key: np.array(value) for key, value in current.items()}
        calls.append(Step(copied, state, new_model, new_state, server_round))
        return new_model, new_state

    monkeypatch.setattr(ServerOptimizer, "step", spy)
    return calls


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_steps_with_every_optimizer(
    strategy: str, optimizer: str, steps: list[Step], tmp_path: Path
) -> None:
    rows = run(strategy, optimizer, tmp_path)
    assert [row["round"] for row in rows] == list(range(ROUNDS + 1))
    assert all(math.isfinite(row["loss"]) for row in rows), rows
    assert [step.server_round for step in steps] == list(range(1, ROUNDS + 1))
    first, second = steps
    assert first.state_in == OptimizerState()
    assert second.state_in is first.state_out
    assert first.state_out.first, "the step keeps its moments"
    # Round 2 starts from the model round 1's step made.
    assert second.current.keys() == first.new_model.keys()
    for key, value in first.new_model.items():
        np.testing.assert_array_equal(second.current[key], value)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_without_an_optimizer_the_model_is_the_methods_own_object(
    strategy: str,
    steps: list[Step],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    identical: list[bool] = []
    original = ImportanceStrategy.server_step

    def spy(
        self: ImportanceStrategy[Any], plan: Any, aggregated: ArrayRecord | None
    ) -> ArrayRecord | None:
        result = original(self, plan, aggregated)
        identical.append(result is aggregated)
        return result

    monkeypatch.setattr(ImportanceStrategy, "server_step", spy)
    rows = run(strategy, "none", tmp_path)
    assert [row["round"] for row in rows] == list(range(ROUNDS + 1))
    assert steps == []
    if strategy in LIBRARY_METHODS:
        assert identical == [True] * ROUNDS
