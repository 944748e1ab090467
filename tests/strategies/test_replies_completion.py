"""Every strategy survives nodes that raise, time out or reply empty.

The real strategies and ClientApps run in process with
:func:`~flwr_importance.tooling.testing.fault_injection.fault_injection_mod` failing 30%
of the replies. Flower's own ``FedAvg`` (the ``fedavg``/``fedprox`` baselines)
raises ``InconsistentMessageReplies`` on an empty reply, so the baselines are
tested with the kinds Flower handles (``raise``, ``timeout``).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from flwr_importance.strategies.replies import ClientSideFailedError
from flwr_importance.tooling.testing.fault_injection import FaultPlan
from simulations.inprocess import run_inprocess
from simulations.methods import LIBRARY_METHODS

STRATEGIES = list(LIBRARY_METHODS)
ROUNDS = 3


@pytest.fixture
def flower_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Capture Flower's logger (it does not propagate to the root by default)."""
    flower = logging.getLogger("flwr")
    flower.propagate = True
    with caplog.at_level(logging.WARNING):
        yield caplog
    flower.propagate = False


def run_with_faults(
    strategy: str, kinds: str, output_dir: Path
) -> list[dict[str, float]]:
    rows, _ = run_inprocess(
        {
            "strategy": strategy,
            "partitioning": "iid",
            "num-server-rounds": ROUNDS,
            "clients-per-round": 6,
            "local-steps": 5,
            "fault-rate": 0.3,
            "fault-kinds": kinds,
            # 0: a timeout fault loses its reply at once (in process).
            "fault-delay": 0.0,
            "output-dir": str(output_dir),
        },
        num_clients=12,
    )
    return rows


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_completes_its_rounds_and_names_failed_nodes(
    strategy: str, flower_logs: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    rows = run_with_faults(strategy, "raise,timeout,silent", tmp_path)
    assert [row["round"] for row in rows] == list(range(ROUNDS + 1))
    assert all(math.isfinite(row["loss"]) for row in rows), rows
    assert rows[-1]["loss"] < rows[0]["loss"], rows
    injected = re.findall(
        r"fault injection: node (\d+), \S+: (raise|silent)", flower_logs.text
    )
    assert injected, "the fault rate should have failed some replies"
    server_lines = [
        record.getMessage()
        for record in flower_logs.records
        if not record.getMessage().startswith("fault injection")
    ]
    for node_id, _ in injected:
        assert any(node_id in line for line in server_lines), (
            f"no server log line names failed node {node_id}"
        )


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox"])
def test_flower_baselines_complete_with_errors_and_time_outs(
    strategy: str, tmp_path: Path
) -> None:
    rows = run_with_faults(strategy, "raise,timeout", tmp_path)
    assert [row["round"] for row in rows] == list(range(ROUNDS + 1))
    assert rows[-1]["loss"] < rows[0]["loss"], rows


def test_fault_plan_hits_its_rate_and_is_deterministic() -> None:
    plan = FaultPlan(rate=0.3, seed=7)
    draws = [
        plan.fault_for(node, rnd, "train") for node in range(200) for rnd in range(20)
    ]
    rate = np.mean([fault is not None for fault in draws])
    # 4 standard errors of a Bernoulli(0.3) mean over 4,000 draws.
    assert abs(rate - 0.3) < 4 * math.sqrt(0.3 * 0.7 / len(draws))
    again = [
        plan.fault_for(node, rnd, "train") for node in range(200) for rnd in range(20)
    ]
    assert draws == again
    assert {fault for fault in draws if fault} == {"raise", "timeout", "silent"}


@pytest.mark.parametrize(
    ("field", "value"),
    [("rate", 1.5), ("kinds", ("crash",)), ("kinds", ()), ("delay", -1.0)],
)
def test_fault_plan_rejects_bad_settings(field: str, value: object) -> None:
    with pytest.raises(ValueError, match="fault"):
        FaultPlan(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_run_where_every_node_fails_stops_quoting_the_nodes_error(
    strategy: str, tmp_path: Path
) -> None:
    """Nothing can train: the run stops in round 1 instead of keeping the model."""
    with pytest.raises(ClientSideFailedError, match="injected fault") as stopped:
        run_inprocess(
            {
                "strategy": strategy,
                "partitioning": "iid",
                "num-server-rounds": 2,
                "clients-per-round": 4,
                "local-steps": 2,
                "fault-rate": 1.0,
                "fault-kinds": "raise,timeout",
                "fault-delay": 0.0,
                "output-dir": str(tmp_path),
            },
            num_clients=6,
        )
    assert "nothing can train" in str(stopped.value)
