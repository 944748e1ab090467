"""Load: 1,000 virtual nodes, 50 per round, every strategy, server time per round.

:mod:`tests.e2e.load_app` runs each strategy in turn on the same
1,000 nodes and records the server-side time of each round
(``configure_train`` + ``aggregate_train`` without the client round trips
inside them). Small model and data (logistic regression on Synthetic-IID, 20
samples per node, one local step) keep the clients' work small.

Two rounds of every strategy send about 11,700 messages (FedSampling queries
and trains all 1,000 nodes each round; OCS and MMFL query every node's update
norm each round; the size queries of MD and clustered sampling reach every
node once). Both tests run every strategy:

* on the real engine (``flwr run``, 1,000 virtual SuperNodes, one Ray start,
  one CPU per ClientApp), one round each: the suite's longest single run;
* on the in-process grid with 1,000 nodes: the same ServerApp code, handlers
  and protobuf round trips, without Ray.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from flwr_importance.tooling.launcher import processes_mentioning
from tests.e2e.load_app import (
    NUM_NODES,
    ROUNDS,
    STRATEGIES,
    run_load_flwr,
    run_load_inprocess,
)


def check_results(
    results: dict[str, Any], strategies: tuple[str, ...], num_rounds: int = ROUNDS
) -> None:
    """Every strategy ran its rounds; timings and final metrics are finite."""
    assert results["num_nodes"] == NUM_NODES
    assert list(results["methods"]) == list(strategies)
    for name, method in results["methods"].items():
        rounds = {int(server_round) for server_round in method["rounds"]}
        assert rounds == set(range(1, num_rounds + 1)), name
        for timing in method["rounds"].values():
            assert 0 <= timing["server_s"] < 30, (name, timing)
        assert method["final_metrics"], name
        for key, value in method["final_metrics"].items():
            assert math.isfinite(value), (name, key)


@pytest.mark.slow
# Besides its own minutes, the wait for another heavy run (tests/heavy.py).
@pytest.mark.timeout(1200, func_only=True)
@pytest.mark.usefixtures("heavy_run")
def test_every_strategy_runs_on_1000_virtual_supernodes(tmp_path: Path) -> None:
    flwr_home = tmp_path / "flwr-home"
    # One round: every query (sizes, norms, losses, FedSampling's) and train
    # message reaches the 1,000 nodes in it; the second round of the
    # in-process test below adds what a round finds in the node state.
    results = run_load_flwr(tmp_path, STRATEGIES, timeout=560, rounds=1)
    assert processes_mentioning(str(flwr_home.resolve())) == []
    check_results(results, STRATEGIES, num_rounds=1)


@pytest.mark.slow
def test_every_strategy_runs_on_1000_in_process_nodes(tmp_path: Path) -> None:
    results = run_load_inprocess(STRATEGIES, tmp_path)
    check_results(results, STRATEGIES)
    for name, method in results["methods"].items():
        print(name, {r: round(t["server_s"], 4) for r, t in method["rounds"].items()})
