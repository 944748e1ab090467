"""A deployment that lets no one in: TLS and SuperNode authentication end to end.

One :func:`secure_deployment` (a SuperLink with TLS and
``--enable-supernode-auth``, four SuperNodes whose keys were registered with
``flwr supernode register``) serves every check of this module. Before the
runs are submitted, two outsiders try to join: a TLS SuperNode signing with a
key never registered, and a plaintext (``--insecure``) SuperNode (without a
key: Flower's SuperNode itself refuses to send a key in plaintext, exit code
303). Both give up within their ``--max-retries``/``--max-wait-time``. OCS and
FedSampling (each method's smoke run, at the size of
``test_deployment_strategies``) then run through TLS; FedSampling's ServerApp
records the sender of every reply it gets (its size query goes to every node
the SuperLink knows), which shows who the strategy saw.

The docs' secure-deployment recipe is checked against the flags the launcher
passes (``docs/deployment.md``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from flwr_importance.tooling.launcher import secure_deployment
from flwr_importance.tooling.launcher.secure import (
    OUTSIDER_MAX_WAIT_SECONDS,
    Credentials,
    connection_settings,
    superlink_flags,
    supernode_flags,
    write_node_key,
)
from tests.e2e.deployment.capturing_server_app import REPLIES_FILE
from tests.e2e.deployment.test_deployment_strategies import (
    APP_DIR,
    FORKING_SUPEREXEC,
    NUM_SUPERNODES,
    capturing_app,
    run_config,
)
from tests.heavy import heavy_run_slot, shared_dir

# Besides its own minutes, the wait for another heavy run (tests/heavy.py).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200, func_only=True)]

STRATEGIES = ("ocs", "fedsampling")
CAPTURED = "fedsampling"
DOCS = APP_DIR / "docs" / "deployment.md"


@pytest.fixture(scope="module")
def secure_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What one secure deployment did; it runs once per session (xdist-safe)."""
    results = shared_dir(tmp_path_factory) / "secure-deployment-runs.json"
    with heavy_run_slot(tmp_path_factory):
        if not results.exists():
            results.write_text(json.dumps(run_secure_deployment(tmp_path_factory)))
    return dict(json.loads(results.read_text()))


def run_secure_deployment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Outsiders try to join, then OCS and FedSampling run; what happened."""
    work = tmp_path_factory.mktemp("secure-deployment")
    outputs = {strategy: work / "out" / strategy for strategy in STRATEGIES}
    apps = {strategy: APP_DIR for strategy in STRATEGIES}
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
        run_ids = {
            running.submit(apps[strategy], run_config(strategy, outputs[strategy])): (
                strategy
            )
            for strategy in STRATEGIES
        }
        # A node that kept trying past its bound would raise TimeoutExpired here.
        outsider_codes = {
            name: process.wait(timeout=OUTSIDER_MAX_WAIT_SECONDS + 60)
            for name, process in outsiders.items()
        }
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


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_secure_run_completes_over_tls_with_authenticated_nodes(
    secure_runs: Mapping[str, Any], strategy: str
) -> None:
    status = secure_runs["statuses"][strategy]
    assert status == "finished:completed", (status, secure_runs["logs"])
    rows = json.loads(
        (Path(secure_runs["outputs"][strategy]) / "history.json").read_text()
    )
    assert [row["round"] for row in rows] == [0, 1, 2]
    superlink_log = (Path(secure_runs["logs"]) / "superlink.log").read_text()
    assert "Uvicorn running on https://127.0.0.1:" in superlink_log
    assert "insecure" not in superlink_log.lower()


def test_the_strategy_hears_only_from_registered_nodes(
    secure_runs: Mapping[str, Any],
) -> None:
    """Every reply FedSampling got came from a registered, TLS-connected node."""
    replies = json.loads(
        (Path(secure_runs["outputs"][CAPTURED]) / REPLIES_FILE).read_text()
    )
    senders = {reply["src-node-id"] for reply in replies}
    assert senders == set(secure_runs["registered"])


def test_the_superlink_knows_only_the_registered_nodes(
    secure_runs: Mapping[str, Any],
) -> None:
    nodes = {int(node_id): status for node_id, status in secure_runs["nodes"].items()}
    assert sorted(nodes) == secure_runs["registered"]
    assert set(nodes.values()) == {"online"}


def test_a_node_with_an_unregistered_key_is_refused_and_gives_up(
    secure_runs: Mapping[str, Any],
) -> None:
    logs = Path(secure_runs["logs"])
    assert secure_runs["outsider-codes"]["unknown"] != 0
    assert "Failed to activate SuperNode" in (logs / "unknown.log").read_text()
    superlink_log = (logs / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in superlink_log


def test_a_plaintext_node_cannot_connect(secure_runs: Mapping[str, Any]) -> None:
    log = (Path(secure_runs["logs"]) / "plaintext.log").read_text()
    assert secure_runs["outsider-codes"]["plaintext"] != 0
    assert "Giving up reconnection" in log
    assert "could not establish a connection to the SuperLink" in log
    assert "SuperNode ID:" not in log


def test_secure_deployment_leaves_no_process(secure_runs: Mapping[str, Any]) -> None:
    assert secure_runs["leftover"] == []


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
