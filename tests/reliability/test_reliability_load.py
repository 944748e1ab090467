"""Load: 1,000 virtual nodes, 50 per round, every strategy, server time per round.

:mod:`tests.reliability.load_app` runs each strategy in turn for two rounds on
the same 1,000 nodes and records the server-side time of each round
(``configure_train`` + ``aggregate_train`` without the client round trips
inside them). Small model and data (logistic regression on Synthetic-IID, 20
samples per node, one local step) keep the clients' work small.

Two rounds of every strategy send about 11,700 messages (FedSampling queries
and trains all 1,000 nodes each round; OCS and MMFL query every node's update
norm each round; the size queries of SizeWeighted, MD and clustered sampling
reach every node once). Both tests run every strategy:

* on the real engine (``flwr run``, 1,000 virtual SuperNodes, one Ray start,
  one CPU per ClientApp): about 2 minutes on two cores, 4-4.5 at a load
  average near 20 (other tests alongside), hence the 480 s time-out;
* on the in-process grid with 1,000 nodes: the same ServerApp code, handlers
  and protobuf round trips, without Ray.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from flwr_importance.launcher import processes_mentioning
from tests.reliability.load_app import (
    NUM_NODES,
    ROUNDS,
    STRATEGIES,
    run_load_flwr,
    run_load_inprocess,
)


def check_results(results: dict[str, Any], strategies: tuple[str, ...]) -> None:
    """Every strategy ran its rounds; timings and final metrics are finite."""
    assert results["num_nodes"] == NUM_NODES
    assert list(results["methods"]) == list(strategies)
    for name, method in results["methods"].items():
        rounds = {int(server_round) for server_round in method["rounds"]}
        assert rounds == set(range(1, ROUNDS + 1)), name
        for timing in method["rounds"].values():
            assert 0 <= timing["server_s"] < 30, (name, timing)
        assert method["final_metrics"], name
        for key, value in method["final_metrics"].items():
            assert math.isfinite(value), (name, key)


@pytest.mark.slow
# Besides its own minutes, the wait for another heavy run (tests/heavy.py).
@pytest.mark.timeout(1200)
@pytest.mark.usefixtures("heavy_run")
def test_every_strategy_runs_on_1000_virtual_supernodes(tmp_path: Path) -> None:
    flwr_home = tmp_path / "flwr-home"
    # About 3 min alone, 5 min beside the rest of the suite on 2 cores.
    results = run_load_flwr(tmp_path, STRATEGIES, timeout=560)
    assert processes_mentioning(str(flwr_home.resolve())) == []
    check_results(results, STRATEGIES)


@pytest.mark.slow
def test_every_strategy_runs_on_1000_in_process_nodes(tmp_path: Path) -> None:
    results = run_load_inprocess(STRATEGIES, tmp_path)
    check_results(results, STRATEGIES)
    for name, method in results["methods"].items():
        print(name, {r: round(t["server_s"], 4) for r, t in method["rounds"].items()})
