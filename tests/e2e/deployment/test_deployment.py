"""Deployment engine: every strategy through ``flwr run`` on a real, secure SuperLink.

One :func:`secure_deployment` on loopback serves every check of this module: a
``flower-superlink`` with TLS and ``--enable-supernode-auth``, and four
``flower-supernode`` processes whose keys were registered with ``flwr
supernode register``, each with its own partition (``--node-config
"partition-id=i num-partitions=4"``). Before the runs are submitted, two
outsiders try to join: a TLS SuperNode signing with a key never registered,
and a plaintext (``--insecure``) SuperNode (without a key: Flower's SuperNode
itself refuses to send a key in plaintext, exit code 303). Both must give up
within their ``--max-retries``/``--max-wait-time``. Then one small run per
strategy is submitted; the SuperLink runs them concurrently (the fixture waits
for all of them with ``flwr ls``). Each run must finish over TLS, improve the
model and write its history; afterwards no process of the deployment may be
left.

The app processes are served in Flower's ``process`` isolation mode by
``forking_superexec`` (the stock ``flower-superexec`` forking each
``flwr-serverapp``/``flwr-clientapp`` from an interpreter with torch already
imported), which keeps the ~150 app processes of this file within its budget
on two cores; everything else is stock Flower.

FedSampling's run uses ``capturing_server_app``: the same ServerApp code on a
grid that records every reply the server received (its size query goes to
every node the SuperLink knows), to check its privacy on the wire and who the
strategy heard from. The mechanism's epsilon-LDP itself is tested
statistically in ``tests/strategies/test_fedsampling_privacy.py``.

The docs' secure-deployment recipe is checked against the flags the launcher
passes (``docs/deployment.md``).
"""

from __future__ import annotations

import json
import re
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
from flwr_importance.tooling.launcher import secure_deployment
from flwr_importance.tooling.launcher.secure import (
    OUTSIDER_MAX_WAIT_SECONDS,
    Credentials,
    connection_settings,
    superlink_flags,
    supernode_flags,
    write_node_key,
)
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
DOCS = APP_DIR / "docs" / "deployment.md"
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
    """What the deployment did: statuses, outputs, nodes, outsiders, leftovers.

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
    """Outsiders try to join, then every strategy runs; what happened."""
    work = tmp_path_factory.mktemp("deployment")
    outputs = {strategy: work / "out" / strategy for strategy in RUNS}
    apps = {strategy: APP_DIR for strategy in RUNS}
    apps[CAPTURED] = capturing_app(work / "capturing-app")
    with secure_deployment(
        NUM_SUPERNODES,
        work,
        executor=FORKING_SUPEREXEC,
        extra_env={"PYTHONPATH": str(APP_DIR)},
    ) as running:
        assert running.credentials is not None
        keys = running.credentials.ca_certificate.parent
        # A key the SuperLink never saw.
        unknown_key = write_node_key(keys / "unknown")
        partition = {"partition-id": 0, "num-partitions": NUM_SUPERNODES}
        outsiders = {
            "unknown": running.start_outsider(
                "unknown", private_key=unknown_key, node_config=partition
            ),
            "plaintext": running.start_outsider(
                "plaintext", insecure=True, node_config=partition
            ),
        }
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
        # A node that kept trying past its bound would raise TimeoutExpired here.
        outsider_codes = {
            name: process.wait(timeout=OUTSIDER_MAX_WAIT_SECONDS + 60)
            for name, process in outsiders.items()
        }
        # About 100 s alone; CI runs other tests beside it on the same 2 cores.
        statuses = running.wait(list(run_ids), timeout=480)
        nodes = running.nodes()
    return {
        "statuses": {run_ids[run_id]: status for run_id, status in statuses.items()},
        "outputs": {name: str(path) for name, path in outputs.items()},
        "registered": sorted(running.registered.values()),
        "nodes": {str(node_id): status for node_id, status in nodes.items()},
        "outsider-codes": outsider_codes,
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


def test_the_superlink_serves_only_tls(deployment_runs: Mapping[str, Any]) -> None:
    superlink_log = (Path(deployment_runs["logs"]) / "superlink.log").read_text()
    assert "Uvicorn running on https://127.0.0.1:" in superlink_log
    assert "insecure" not in superlink_log.lower()


def test_the_strategy_hears_only_from_registered_nodes(
    deployment_runs: Mapping[str, Any],
) -> None:
    """Every reply FedSampling got came from a registered, TLS-connected node."""
    replies = json.loads(
        (deployment_runs["outputs"][CAPTURED] / REPLIES_FILE).read_text()
    )
    senders = {reply["src-node-id"] for reply in replies}
    assert senders == set(deployment_runs["registered"])


def test_the_superlink_knows_only_the_registered_nodes(
    deployment_runs: Mapping[str, Any],
) -> None:
    nodes = {
        int(node_id): status for node_id, status in deployment_runs["nodes"].items()
    }
    assert sorted(nodes) == deployment_runs["registered"]
    assert set(nodes.values()) == {"online"}


def test_a_node_with_an_unregistered_key_is_refused_and_gives_up(
    deployment_runs: Mapping[str, Any],
) -> None:
    logs = Path(deployment_runs["logs"])
    assert deployment_runs["outsider-codes"]["unknown"] != 0
    assert "Failed to activate SuperNode" in (logs / "unknown.log").read_text()
    superlink_log = (logs / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in superlink_log


def test_a_plaintext_node_cannot_connect(deployment_runs: Mapping[str, Any]) -> None:
    log = (Path(deployment_runs["logs"]) / "plaintext.log").read_text()
    assert deployment_runs["outsider-codes"]["plaintext"] != 0
    assert "Giving up reconnection" in log
    assert "could not establish a connection to the SuperLink" in log
    assert "SuperNode ID:" not in log


def command_flags(text: str, command: str) -> set[str]:
    """The ``--flag`` names of the lines of ``command`` in the docs' bash blocks."""
    joined = text.replace("\\\n", " ")
    flags: set[str] = set()
    for line in joined.splitlines():
        if line.strip().startswith(command):
            flags.update(re.findall(r"(--[a-z-]+)", line))
    return flags


def test_docs_recipe_uses_the_launchers_flags(tmp_path: Path) -> None:
    """``docs/deployment.md`` runs the commands :func:`secure_deployment` runs."""
    doc = DOCS.read_text()
    credentials = Credentials(
        ca_certificate=tmp_path / "ca.crt",
        server_certificate=tmp_path / "server.pem",
        server_key=tmp_path / "server.key",
        node_keys=(tmp_path / "supernode-0",),
    )
    names = {flag.split("=")[0] for flag in superlink_flags(credentials)}
    assert names <= command_flags(doc, "flower-superlink")
    node_flags = supernode_flags(credentials.ca_certificate, credentials.node_keys[0])
    names = {flag.split("=")[0] for flag in node_flags}
    assert names <= command_flags(doc, "flower-supernode")
    assert "flwr supernode register" in doc
    setting = connection_settings(credentials.ca_certificate).split("=")[0].strip()
    assert setting in doc
    assert "--auth-list-public-keys" not in command_flags(doc, "flower-superlink")
    assert "depends on the Flower release" not in doc
