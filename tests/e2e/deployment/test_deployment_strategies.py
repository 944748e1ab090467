"""Deployment engine: every strategy through ``flwr run`` on a real SuperLink.

One ``flower-superlink`` and four ``flower-supernode`` processes on loopback,
each SuperNode with its own partition (``--node-config "partition-id=i
num-partitions=4"``). One small run per strategy is submitted to the same
federation; the SuperLink runs them concurrently (the fixture waits for all of
them with ``flwr ls``). Each run must finish, improve the model and write its
history; afterwards no process of the deployment may be left.

The app processes are served in Flower's ``process`` isolation mode by
``forking_superexec`` (the stock ``flower-superexec`` forking each
``flwr-serverapp``/``flwr-clientapp`` from an interpreter with torch already
imported), which keeps the ~150 app processes of this file within its budget
on two cores; everything else is stock Flower.

FedSampling's run uses ``capturing_server_app``: the same ServerApp code on a
grid that records every reply the server received, to check its privacy on
the wire. The mechanism's epsilon-LDP itself is tested statistically in
``tests/strategies/test_fedsampling_privacy.py``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from flwr_importance.clientapps.fedsampling import UNSAFE_REPRODUCIBLE_COINS_KEY
from flwr_importance.protocol import (
    FEDSAMPLING_NODE_ANSWERS,
    FEDSAMPLING_NODE_EPSILON,
    FEDSAMPLING_NODE_REPRODUCIBLE_COINS,
    FEDSAMPLING_SIZE_RESPONSE,
)
from flwr_importance.registry import RunConfigValue, methods
from flwr_importance.tooling.launcher import deployment
from simulations.config import ExperimentConfig
from simulations.inprocess import load_preset, resolve_run_config
from simulations.task import federated_data
from simulations.tooling import declaration
from tests.app_variant import app_variant
from tests.e2e.deployment.capturing_server_app import REPLIES_FILE
from tests.heavy import heavy_run_slot, shared_dir

# Besides its own minutes, the wait for another heavy run (tests/heavy.py).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200, func_only=True)]

APP_DIR = Path(__file__).resolve().parents[3]
NUM_SUPERNODES = 4
FORKING_SUPEREXEC = [sys.executable, "-m", "tests.e2e.deployment.forking_superexec"]

# A few rounds of a tiny model, whatever the preset's scale. The presets' label
# skew makes two rounds too few to improve reliably: IID data where they skew,
# as this checks the deployment plumbing, not a method.
SMALL = {
    "num-supernodes": NUM_SUPERNODES,
    "num-server-rounds": 2,
    "clients-per-round": 2,
    "local-steps": 5,
    "local-epochs": 0,
}
# strategy -> (preset or None, extra overrides): Flower's FedAvg and each
# registry method's short end-to-end check.
RUNS: dict[str, tuple[str | None, Mapping[str, RunConfigValue]]] = {
    "fedavg": (None, {"strategy": "fedavg", "partitioning": "iid"}),
    **{spec.name: declaration(spec.name).smoke_run for spec in methods()},
}
# One strategy takes a server optimizer on the deployment engine (issue 26):
# FedAvgM's step, whose first round is OCS's own step at lr 1.
OPTIMIZED = "ocs"
SERVER_OPTIMIZER = {
    "server-optimizer": "momentum",
    "server-optimizer-eta": 1.0,
    "server-optimizer-momentum": 0.5,
}
RUNS[OPTIMIZED] = (RUNS[OPTIMIZED][0], {**RUNS[OPTIMIZED][1], **SERVER_OPTIMIZER})
CAPTURED = "fedsampling"
# The captured run is the privacy check: the nodes' own coins, whatever the
# benchmark preset says.
RUNS[CAPTURED] = (
    RUNS[CAPTURED][0],
    {**RUNS[CAPTURED][1], UNSAFE_REPRODUCIBLE_COINS_KEY: False},
)


def run_config(strategy: str, output_dir: Path) -> dict[str, bool | int | float | str]:
    """The run-config overrides of ``strategy``'s deployment run."""
    preset, extra = RUNS[strategy]
    overrides = load_preset(preset) if preset else {}
    return {**overrides, **SMALL, **extra, "output-dir": str(output_dir)}


def capturing_app(app_dir: Path) -> Path:
    """A copy of the app whose ServerApp is ``capturing_server_app``."""
    return app_variant(
        app_dir,
        Path(__file__).with_name("capturing_server_app.py"),
        {"serverapp": "tests.e2e.deployment.capturing_server_app:app"},
    )


@pytest.fixture(scope="module")
def deployment_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every strategy's status and output dir from one deployment run.

    The deployment runs once per session: xdist may hand this module's tests
    to several workers, and the first to hold the heavy-run lock leaves the
    results in the session's shared folder for the others.
    """
    results = shared_dir(tmp_path_factory) / "deployment-runs.json"
    with heavy_run_slot(tmp_path_factory):
        if not results.exists():
            results.write_text(json.dumps(run_deployment(tmp_path_factory)))
    found = json.loads(results.read_text())
    return {
        **found,
        "outputs": {name: Path(path) for name, path in found["outputs"].items()},
    }


def run_deployment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run every strategy on one deployment; their statuses and output dirs."""
    work = tmp_path_factory.mktemp("deployment")
    outputs = {strategy: work / "out" / strategy for strategy in RUNS}
    apps = {strategy: APP_DIR for strategy in RUNS}
    apps[CAPTURED] = capturing_app(work / "capturing-app")
    with deployment(
        NUM_SUPERNODES,
        work,
        executor=FORKING_SUPEREXEC,
        extra_env={"PYTHONPATH": str(APP_DIR)},
    ) as running:
        # `flwr run` builds and uploads a FAB, then returns: submit all at once.
        with ThreadPoolExecutor(max_workers=len(RUNS)) as pool:
            run_ids = dict(
                zip(
                    pool.map(
                        lambda strategy: running.submit(
                            apps[strategy], run_config(strategy, outputs[strategy])
                        ),
                        RUNS,
                    ),
                    RUNS,
                    strict=True,
                )
            )
        # About 100 s alone; CI runs other tests beside it on the same 2 cores.
        statuses = running.wait(list(run_ids), timeout=480)
    return {
        "statuses": {run_ids[run_id]: status for run_id, status in statuses.items()},
        "outputs": {name: str(path) for name, path in outputs.items()},
        "leftover": running.leftover_processes(),
        "logs": str(work / "logs"),
    }


def test_deployment_leaves_no_process(deployment_runs: Mapping[str, Any]) -> None:
    assert deployment_runs["leftover"] == []


def test_deployment_runs_a_strategy_with_a_server_optimizer(
    deployment_runs: Mapping[str, Any],
) -> None:
    assert deployment_runs["statuses"][OPTIMIZED] == "finished:completed"
    logs = Path(deployment_runs["logs"])
    summary = "Server optimizer: ServerMomentum (Flower's FedAvgM step)"
    assert any(summary in path.read_text() for path in logs.glob("*.log")), logs


@pytest.mark.parametrize("strategy", list(RUNS))
def test_deployment_run_finishes_and_improves_the_model(
    deployment_runs: Mapping[str, Any], strategy: str
) -> None:
    status = deployment_runs["statuses"][strategy]
    assert status == "finished:completed", (status, deployment_runs["logs"])
    output_dir = deployment_runs["outputs"][strategy]
    rows = json.loads((output_dir / "history.json").read_text())
    assert [row["round"] for row in rows] == [0, 1, 2]
    # Some round improves on the initial model: with two clients of random
    # node IDs per round, an importance-weighted step may overshoot in one.
    assert min(row["loss"] for row in rows[1:]) < rows[0]["loss"], rows


def true_sizes() -> list[int]:
    """Each partition's number of samples in FedSampling's deployment run."""
    config = ExperimentConfig.from_run_config(
        resolve_run_config(run_config(CAPTURED, Path("unused")))
    )
    data = federated_data(config, NUM_SUPERNODES)
    return [len(partition.x) for partition in data.partitions]


def test_deployment_fedsampling_sizes_never_reach_the_server_exactly(
    deployment_runs: Mapping[str, Any],
) -> None:
    """Only randomized size replies cross the wire; nothing else about sizes.

    "Carrying the true size" means a reply holding a value the server can read
    as ``|D_c|`` with certainty: a ``num-examples``-like metric, any metric in
    a train reply, or size replies that are the true sizes. The server
    received, over the whole run, one ``size-response`` per size reply (in
    ``1..M-1``) beside the node's own ledger (answers so far, epsilon spent,
    coins not reproducible), and train replies with arrays only; and the
    responses of a round are not the nodes' true sizes.
    """
    config = run_config(CAPTURED, Path("unused"))
    replies = json.loads(
        (deployment_runs["outputs"][CAPTURED] / REPLIES_FILE).read_text()
    )
    size_replies = [
        reply for reply in replies if reply["message-type"] == "query.sizes"
    ]
    train_replies = [reply for reply in replies if reply["message-type"] == "train"]
    num_rounds = int(config["num-server-rounds"])
    assert len(size_replies) == NUM_SUPERNODES * num_rounds
    assert train_replies
    assert not any(reply["error"] for reply in replies)
    max_size = int(config["fedsampling-max-size"])
    responses = []
    for reply in size_replies:
        assert reply["configs"] == {} and reply["arrays"] == []
        (metrics,) = reply["metrics"].values()
        assert set(metrics) == {
            FEDSAMPLING_SIZE_RESPONSE,
            FEDSAMPLING_NODE_ANSWERS,
            FEDSAMPLING_NODE_EPSILON,
            FEDSAMPLING_NODE_REPRODUCIBLE_COINS,
        }
        assert metrics[FEDSAMPLING_NODE_REPRODUCIBLE_COINS] == 0
        assert 1 <= metrics[FEDSAMPLING_SIZE_RESPONSE] <= max_size - 1
        responses.append(int(metrics[FEDSAMPLING_SIZE_RESPONSE]))
    for reply in train_replies:
        assert reply["metrics"] == {} and reply["configs"] == {}, reply
    sizes = sorted(min(size, max_size - 1) for size in true_sizes())
    for round_start in range(0, len(responses), NUM_SUPERNODES):
        assert sorted(responses[round_start : round_start + NUM_SUPERNODES]) != sizes
