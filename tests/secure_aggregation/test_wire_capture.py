"""What crosses the wire under SecAgg+: no client's private value in the clear.

One loopback deployment (a real SuperLink and SuperNodes, Flower's deployment
engine) whose SuperNodes reach the SuperLink through a :class:`WireTap`, a TCP
relay that keeps every byte the nodes send. Two apps run on it, each with its
ClientApp swapped for one that records every float of every reply as the
library's client side made it, before any masking (``reply_recorder``):

- the SecAgg+ example (``examples/secaggplus``): FedSampling's ``G_c``;
- the AOCS test app (``aocs_app``): each node's update, norm and size replies,
  and, under SecAgg+, each vector it puts into a secure sum.

First both apps run under SecAgg+ side by side, then both in the clear; the
capture is split between the two phases. The capture point is the nodes' side
of the SuperLink's gRPC port: in an insecure deployment that is plaintext
HTTP/2, where an array's bytes appear as they are, cut only at HTTP/2 frame
boundaries, so the test looks for short windows of float32 arrays and for
each float64 value's own 8 bytes (``reply_recorder.searchable``). Without
SecAgg+ most of them must be found (so the search works); under SecAgg+ none
may be.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flwr_importance.tooling.launcher import deployment
from flwr_importance.tooling.launcher.wiretap import WireTap
from tests.heavy import heavy_run_slot, shared_dir
from tests.secure_aggregation.reply_recorder import searchable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_SUPERNODES = 5
# One round each: a SecAgg+ round is many message round trips (four stages per
# secure sum, several sums for AOCS), each a ClientApp process per node.
ROUNDS = 1
# app -> (its folder, its ClientApp's component, the recording module under
# tests/secure_aggregation, its run config besides the phase's).
APPS: dict[str, tuple[Path, str, str, dict[str, Any]]] = {
    "fedsampling": (
        REPO_ROOT / "examples" / "secaggplus",
        "secaggplus_app.client_app:app",
        "recording_fedsampling_app",
        {"num-supernodes": NUM_SUPERNODES, "num-server-rounds": ROUNDS},
    ),
    "aocs": (
        Path(__file__).with_name("aocs_app"),
        "secure_aocs_app.client_app:app",
        "recording_aocs_app",
        # One AOCS iteration: every kind of secure sum, fewer of them.
        {"num-server-rounds": ROUNDS, "aocs-iterations": 1},
    ),
}
PHASES = ("secure", "plain")


def recording_app(app: str, destination: Path) -> Path:
    """A copy of ``app`` whose ClientApp records its replies to ``record-dir``."""
    folder, component, module, _ = APPS[app]
    shutil.copytree(folder, destination, ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = destination / "pyproject.toml"
    text = pyproject.read_text()
    stock = f'clientapp = "{component}"'
    assert stock in text, f"{folder}/pyproject.toml no longer names {component}"
    text = text.replace(stock, f'clientapp = "tests.secure_aggregation.{module}:app"')
    config = "[tool.flwr.app.config]\n"
    pyproject.write_text(text.replace(config, f'{config}record-dir = ""\n'))
    return destination


def run_config(app: str, phase: str, records: Path) -> dict[str, Any]:
    """``app``'s run config in ``phase``, recording into ``records``."""
    secure = phase == "secure"
    phase_config = (
        {"secure-aggregation": secure} if app == "fedsampling" else {"runs": phase}
    )
    return {**APPS[app][3], **phase_config, "record-dir": str(records)}


def found_share(records: Path, capture: bytes) -> dict[str, Any]:
    """How many of the recorded replies' searchable strings ``capture`` holds."""
    files = sorted(records.glob("*.npy"))
    strings = [string for path in files for string in searchable(np.load(path))]
    return {
        "replies": len({path.name.split("-")[1] for path in files}),
        "searched": len(strings),
        "found": sum(string in capture for string in strings),
    }


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per phase and app: its status and how much of its replies was on the wire."""
    results = shared_dir(tmp_path_factory) / "wire-capture.json"
    with heavy_run_slot(tmp_path_factory):
        if not results.exists():
            results.write_text(json.dumps(run_captured(tmp_path_factory)))
    return dict(json.loads(results.read_text()))


def run_captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both apps under SecAgg+, then both in the clear, behind one tap."""
    work = tmp_path_factory.mktemp("wire-capture")
    apps = {app: recording_app(app, work / "apps" / app) for app in APPS}
    outcome: dict[str, Any] = {"logs": str(work / "logs")}
    with (
        WireTap() as tap,
        deployment(
            NUM_SUPERNODES,
            work,
            executor=[sys.executable, "-m", "tests.deployment.forking_superexec"],
            # The recording ClientApps live under tests/: the app processes
            # import them from the repository.
            extra_env={"PYTHONPATH": str(REPO_ROOT)},
            supernode_superlink=tap.relay_to,
        ) as running,
    ):
        for phase in PHASES:
            start = len(tap.sent_by_nodes)
            records = {app: work / "records" / phase / app for app in APPS}
            run_ids = {
                running.submit(path, run_config(app, phase, records[app])): app
                for app, path in apps.items()
            }
            statuses = running.wait(list(run_ids), timeout=600)
            capture = tap.sent_by_nodes[start:]
            outcome[phase] = {
                app: {
                    "status": statuses[run_id],
                    **found_share(records[app], capture),
                }
                for run_id, app in run_ids.items()
            }
    outcome["leftover"] = running.leftover_processes()
    return outcome


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("app", APPS)
def test_every_run_completes_on_the_deployment_engine(
    captured: dict[str, Any], phase: str, app: str
) -> None:
    run = captured[phase][app]
    assert run["status"] == "finished:completed", captured["logs"]
    # FedSampling: every node sends its G_c every round; AOCS: its pool.
    expected_replies = NUM_SUPERNODES * ROUNDS if app == "fedsampling" else 1
    assert run["replies"] >= expected_replies, run
    assert run["searched"] > 0, run


@pytest.mark.parametrize("app", APPS)
def test_without_secagg_the_replies_are_on_the_wire(
    captured: dict[str, Any], app: str
) -> None:
    """The search can fail: plain replies are found (frame cuts miss a few)."""
    run = captured["plain"][app]
    assert run["found"] >= 0.5 * run["searched"], run


@pytest.mark.parametrize("app", APPS)
def test_with_secagg_no_private_value_is_on_the_wire(
    captured: dict[str, Any], app: str
) -> None:
    run = captured["secure"][app]
    assert run["found"] == 0, run


def test_the_deployment_leaves_no_process(captured: dict[str, Any]) -> None:
    assert captured["leftover"] == []
