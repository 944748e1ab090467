"""What crosses the wire under SecAgg+: no client's ``G_c`` in the clear.

One loopback deployment (a real SuperLink and SuperNodes, Flower's deployment
engine) whose SuperNodes reach the SuperLink through a :class:`WireTap`, a TCP
relay that keeps every byte the nodes send. The SecAgg+ example
(``examples/secaggplus``) runs FedSampling twice on it, with SecAgg+ and
without, its ClientApp swapped for ``recording_client_app``, which writes every
train reply's float arrays as the library's client side made them, before any
masking. The capture point is the nodes' side of the SuperLink's gRPC port: in
an insecure deployment that is plaintext HTTP/2, where an array's bytes appear
as they are, cut only at HTTP/2 frame boundaries, so a test looks for short
windows of each array's exact float32 bytes.

Without SecAgg+ most windows of every reply must be found (so the search
works); with SecAgg+ none may be. The two runs go side by side on different
seeds (about 3 minutes in all on 2 cores).
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

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = REPO_ROOT / "examples" / "secaggplus"
RECORDING_MODULE = Path(__file__).with_name("recording_client_app.py")
FORKING_SUPEREXEC = [sys.executable, "-m", "tests.deployment.forking_superexec"]
NUM_SUPERNODES = 5
ROUNDS = 2
# Bytes per searched window (8 float32 values) and windows per recorded array.
WINDOW_BYTES = 32
WINDOWS_PER_ARRAY = 16


def recording_app(destination: Path) -> Path:
    """A copy of the example whose ClientApp records its train replies."""
    shutil.copytree(
        EXAMPLE_DIR, destination, ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(RECORDING_MODULE, destination / "secaggplus_app" / "recording.py")
    pyproject = destination / "pyproject.toml"
    text = pyproject.read_text()
    stock = 'clientapp = "secaggplus_app.client_app:app"'
    assert stock in text, "the example's pyproject no longer names its ClientApp so"
    text = text.replace(stock, 'clientapp = "secaggplus_app.recording:app"')
    pyproject.write_text(
        text.replace('output-dir = ""', 'output-dir = ""\nrecord-dir = ""')
    )
    return destination


def windows(array: np.ndarray) -> list[bytes]:
    """``WINDOWS_PER_ARRAY`` windows of the array's float32 bytes, spread evenly."""
    data = np.ascontiguousarray(array, dtype=np.float32).tobytes()
    starts = np.linspace(0, len(data) - WINDOW_BYTES, WINDOWS_PER_ARRAY)
    # Aligned to whole floats, and skipping all-zero windows (they match anything).
    candidates = [
        data[start : start + WINDOW_BYTES]
        for start in (int(s) // 4 * 4 for s in starts)
    ]
    return [window for window in candidates if any(window)]


def found_fraction(records: Path, capture: bytes) -> dict[str, Any]:
    """Per recorded reply array, the fraction of its windows found in ``capture``."""
    fractions = {}
    for path in sorted(records.glob("*.npy")):
        searched = windows(np.load(path))
        if searched:
            fractions[path.name] = sum(w in capture for w in searched) / len(searched)
    return fractions


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each run's status and, per recorded reply array, the share found on the wire."""
    results = shared_dir(tmp_path_factory) / "wire-capture.json"
    with heavy_run_slot(tmp_path_factory):
        if not results.exists():
            results.write_text(json.dumps(run_captured(tmp_path_factory)))
    return dict(json.loads(results.read_text()))


def run_captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the example with and without SecAgg+ behind one tap; what it saw."""
    work = tmp_path_factory.mktemp("wire-capture")
    app = recording_app(work / "app")
    outcome: dict[str, Any] = {"logs": str(work / "logs")}
    with (
        WireTap() as tap,
        deployment(
            NUM_SUPERNODES,
            work,
            executor=FORKING_SUPEREXEC,
            extra_env={"PYTHONPATH": str(REPO_ROOT)},
            supernode_superlink=tap.relay_to,
        ) as running,
    ):
        # Both runs at once, on different seeds: no reply of one equals a
        # reply of the other, so each run's records are searched in the whole
        # capture.
        run_ids = {
            running.submit(
                app,
                {
                    "strategy": "fedsampling",
                    "secure-aggregation": name == "secure",
                    "seed": seed,
                    "num-supernodes": NUM_SUPERNODES,
                    "num-server-rounds": ROUNDS,
                    "record-dir": str(work / "records" / name),
                },
            ): name
            for seed, name in enumerate(("secure", "plain"))
        }
        statuses = running.wait(list(run_ids), timeout=600)
        capture = tap.sent_by_nodes
    for run_id, name in run_ids.items():
        outcome[name] = {
            "status": statuses[run_id],
            "found": found_fraction(work / "records" / name, capture),
        }
    outcome["leftover"] = running.leftover_processes()
    return outcome


@pytest.mark.parametrize("name", ["secure", "plain"])
def test_both_runs_complete_on_the_deployment_engine(
    captured: dict[str, Any], name: str
) -> None:
    assert captured[name]["status"] == "finished:completed", captured["logs"]
    # Every node sent its G_c (one array per parameter tensor) every round.
    nodes_and_rounds = {file.rsplit("-", 1)[0] for file in captured[name]["found"]}
    assert len(nodes_and_rounds) == NUM_SUPERNODES * ROUNDS, captured[name]


def test_without_secagg_every_reply_is_on_the_wire(captured: dict[str, Any]) -> None:
    """The search can fail: plain replies are found (frame cuts miss a few windows)."""
    assert min(captured["plain"]["found"].values()) >= 0.5, captured["plain"]


def test_with_secagg_no_reply_is_on_the_wire(captured: dict[str, Any]) -> None:
    found = captured["secure"]["found"]
    assert found and max(found.values()) == 0.0, found


def test_the_deployment_leaves_no_process(captured: dict[str, Any]) -> None:
    assert captured["leftover"] == []
