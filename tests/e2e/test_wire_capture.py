"""What crosses the wire under SecAgg+: no client's private value in the clear.

One loopback deployment (a real SuperLink and SuperNodes, Flower's deployment
engine) whose SuperNodes reach the SuperLink through a :class:`WireTap`, a TCP
relay that keeps every byte the nodes send. The SecAgg+ example
(``examples/secaggplus``) runs on it, its ClientApp swapped for one that
records every float of every reply as the library's client side made it,
before any masking (``recording_example_app``, ``reply_recorder``), for each
of its methods:

- FedSampling: each node's ``G_c``;
- AOCS: each node's update, norm and size replies (the sizes also as
  integers), and, under SecAgg+, each vector it puts into a secure sum and the
  ``v_i`` and ``n_i`` it keeps.

Each method runs under SecAgg+, then in the clear, one run at a time, and each
run's records are searched in the bytes captured while it ran (runs side by
side would need different seeds, and the forking SuperExec of these tests once
left one of two ServerApps it forked at once hanging). The capture point is
the nodes' side of the SuperLink's gRPC port: in an insecure deployment that
is plaintext HTTP/2, where an array's bytes appear as they are, cut only at
HTTP/2 frame boundaries, so the test looks for short windows of float32 arrays,
for each value of a short float64 vector (metrics, AOCS's secure-sum vectors,
``v_i``) by its own 8 bytes, and for each size by value in every encoding a
reply may give it (``reply_recorder.searchable``, ``integer_encodings``).
Without SecAgg+ most of them must be found (so the search works); under
SecAgg+ none may be. The same runs show FedSampling's models under SecAgg+
within the documented bound of the plain run's, round by round, and AOCS's
within the bound its secure run logs (``quantization-bound``): on one
deployment both runs see the same node ids, so they draw the same pool and
participants.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomllib

from flwr_importance.tooling.launcher import Deployment, deployment
from flwr_importance.tooling.launcher.wiretap import WireTap
from tests.e2e.reply_recorder import integer_encodings, searchable
from tests.heavy import heavy_run_slot, shared_dir
from tests.model_bounds import (
    drift_beyond_bounds,
    fedsampling_step_bound,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500, func_only=True)]

REPO_ROOT = Path(__file__).resolve().parents[2]
NUM_SUPERNODES = 4
EXAMPLE_DIR = REPO_ROOT / "examples" / "secaggplus"
# The example's methods, each with its run config besides the phase's. AOCS:
# one round and one iteration (every kind of secure sum, fewer of them: a
# SecAgg+ sum is four message round trips, each a ClientApp process per node).
APPS: dict[str, dict[str, Any]] = {
    # The secure and plain runs are compared on the same (seeded, unsafe for
    # privacy) coins.
    "fedsampling": {
        "num-server-rounds": 1,
        "fedsampling-unsafe-reproducible-coins": True,
    },
    "aocs": {
        "num-server-rounds": 1,
        "aocs-iterations": 1,
        "local-steps": 5,
        "secure-aocs-unsafe-public-draws": True,
    },
}
# The apps whose sizes are searched: FedSampling's leave the node in the
# clear in both phases by design (its eps-LDP size reply, often the true
# size at the example's epsilon), and under SecAgg+ its num-examples is the
# public weight.
SIZES_SEARCHED = ("aocs",)
PHASES = ("secure", "plain")
# Seconds a run may take (AOCS under SecAgg+ takes about 2.5 minutes here).
RUN_TIMEOUT = 360


def recording_app(destination: Path) -> Path:
    """A copy of the example whose ClientApp records its replies to ``record-dir``."""
    shutil.copytree(
        EXAMPLE_DIR, destination, ignore=shutil.ignore_patterns("__pycache__")
    )
    pyproject = destination / "pyproject.toml"
    text = pyproject.read_text()
    stock = 'clientapp = "secaggplus_app.client_app:app"'
    assert stock in text, "the example's pyproject no longer names its ClientApp so"
    recording = "tests.e2e.recording_example_app:app"
    text = text.replace(stock, f'clientapp = "{recording}"')
    config = "[tool.flwr.app.config]\n"
    pyproject.write_text(text.replace(config, f'{config}record-dir = ""\n'))
    return destination


def run_config(app: str, phase: str, output: Path) -> dict[str, Any]:
    """The example's run config for ``app`` in ``phase``, writing into ``output``."""
    return {
        "strategy": app,
        "secure-aggregation": phase == "secure",
        "num-supernodes": NUM_SUPERNODES,
        **APPS[app],
        "output-dir": str(output / "models"),
        "record-dir": str(output / "records"),
    }


def found_share(records: Path, capture: bytes, *, sizes: bool) -> dict[str, Any]:
    """How many of the recorded replies' searchable strings ``capture`` holds.

    Sizes (the ``int64`` records, only when ``sizes``) count by value: one is
    found when any of its encodings is.
    """
    files = sorted(records.glob("*.npy"))
    arrays = [np.load(path) for path in files]
    strings = [
        string
        for array in arrays
        if array.dtype != np.int64
        for string in searchable(array)
    ]
    whole_numbers = [
        int(value)
        for array in arrays
        if sizes and array.dtype == np.int64
        for value in array.ravel()
        if value >= 2
    ]
    return {
        "replies": len({path.name.split("-")[1] for path in files}),
        "searched": len(strings),
        "found": sum(string in capture for string in strings),
        "sizes-searched": len(whole_numbers),
        "sizes-found": sum(
            any(encoding in capture for encoding in integer_encodings(value))
            for value in whole_numbers
        ),
    }


def completed_run(running: Deployment, app: Path, config: dict[str, Any]) -> str:
    """Submit ``app`` and await its final status."""
    run_id = running.submit(app, config)
    return running.wait([run_id], timeout=RUN_TIMEOUT)[run_id]


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
    example = recording_app(work / "app")
    outcome: dict[str, Any] = {"logs": str(work / "logs")}
    with (
        WireTap() as tap,
        deployment(
            NUM_SUPERNODES,
            work,
            executor=[sys.executable, "-m", "tests.e2e.deployment.forking_superexec"],
            # The recording ClientApps live under tests/: the app processes
            # import them from the repository.
            # One OpenMP thread: a process forked from a warm interpreter must
            # not inherit a thread pool it cannot use.
            extra_env={"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"},
            supernode_superlink=tap.relay_to,
        ) as running,
    ):
        for phase in PHASES:
            for app in APPS:
                output = work / phase / app
                start = len(tap.sent_by_nodes)
                status = completed_run(running, example, run_config(app, phase, output))
                capture = tap.sent_by_nodes[start:]
                outcome.setdefault(phase, {})[app] = {
                    "status": status,
                    "output": str(output),
                    **found_share(
                        output / "records", capture, sizes=app in SIZES_SEARCHED
                    ),
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
    rounds = APPS[app]["num-server-rounds"]
    expected_replies = NUM_SUPERNODES * rounds if app == "fedsampling" else 1
    assert run["replies"] >= expected_replies, run
    assert run["searched"] > 0, run


@pytest.mark.parametrize("app", APPS)
def test_without_secagg_the_replies_are_on_the_wire(
    captured: dict[str, Any], app: str
) -> None:
    """The search can fail: plain replies are found (frame cuts miss a few)."""
    run = captured["plain"][app]
    assert run["found"] >= 0.5 * run["searched"], run
    if app in SIZES_SEARCHED:
        assert run["sizes-found"] >= 0.5 * run["sizes-searched"] > 0, run


@pytest.mark.parametrize("app", APPS)
def test_with_secagg_no_private_value_is_on_the_wire(
    captured: dict[str, Any], app: str
) -> None:
    run = captured["secure"][app]
    assert run["found"] == 0, run
    assert run["sizes-found"] == 0, run
    assert run["sizes-searched"] > 0 or app not in SIZES_SEARCHED, run


def test_the_deployment_leaves_no_process(captured: dict[str, Any]) -> None:
    assert captured["leftover"] == []


def test_fedsampling_under_secagg_gives_the_plain_models(
    captured: dict[str, Any],
) -> None:
    """Each round's global model is the plain run's within the documented bound.

    Both runs are ``flwr run``s of the example on the same SuperNodes (so the
    same node ids) and seeds: the secure run's models may differ by SecAgg+'s
    quantization only (:func:`.model_bounds.drift_beyond_bounds`, docs/privacy.md).
    """
    rounds = APPS["fedsampling"]["num-server-rounds"]
    models = {}
    for phase in PHASES:
        folder = Path(captured[phase]["fedsampling"]["output"]) / "models"
        models[phase] = [
            list(np.load(folder / f"round-{r}.npz").values()) for r in range(rounds + 1)
        ]
    with (EXAMPLE_DIR / "pyproject.toml").open("rb") as file:
        defaults = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
    step_bound = fedsampling_step_bound(defaults, NUM_SUPERNODES)
    assert drift_beyond_bounds(models["secure"], models["plain"], step_bound) == []


def test_aocs_under_secagg_gives_the_plain_model(captured: dict[str, Any]) -> None:
    """Round 1's model is the plain run's within the secure run's logged bound.

    Both runs start from the same model and draw the same participants (same
    node ids and seed), so they differ by SecAgg+'s quantization only
    (docs/privacy.md, "Quantization tolerance"), and by more than nothing.
    """
    folders = {
        phase: Path(captured[phase]["aocs"]["output"]) / "models" for phase in PHASES
    }
    secure, plain = (
        list(np.load(folders[phase] / "round-1.npz").values()) for phase in PHASES
    )
    metrics = json.loads((folders["secure"] / "fit-metrics.json").read_text())
    [[_, bound]] = metrics["quantization-bound"]
    [[_, sampled]] = metrics["num-sampled"]
    assert sampled >= 2, metrics
    difference = max(
        float(np.max(np.abs(a - b))) for a, b in zip(secure, plain, strict=True)
    )
    assert 0 < difference <= bound
