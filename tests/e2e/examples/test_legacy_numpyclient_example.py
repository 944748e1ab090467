"""End to end: the NumPyClient quickstart on the legacy API, under a real ``flwr run``.

One ``flwr run`` of ``examples/quickstart-pytorch-legacy`` runs every method
it serves one after another (its run config's ``strategy``, comma-separated,
each through Flower's legacy server loop); each must complete every round,
and the example's own ``fit`` (its ``FlowerClient``, logging "legacy-example
fit") must be what trained. Each method also runs in process through the
legacy loop (``tests/clientapps/test_numpy_client.py``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.e2e.examples.example_runs import run_methods

EXAMPLE_DIR = (
    Path(__file__).resolve().parents[3] / "examples" / "quickstart-pytorch-legacy"
)
#: The example's server's ``METHODS`` (tests/clientapps/test_numpy_client.py
#: checks the list).
METHODS = [
    "fedavg",
    "md",
    "clustered",
    "clustered-similarity",
    "ocs",
    "aocs",
    "power-of-choice",
]
ROUNDS = 2
NUM_SUPERNODES = 10
#: The line the example's FlowerClient.fit logs, with its partition.
FIT_LINE = re.compile(r"legacy-example fit: partition (\d+), (\d+) examples")
#: Flower's legacy loop: the fit calls of a round, for any strategy.
FIT_ROUND = re.compile(r"configure_fit: strategy sampled (\d+) clients")
#: The example's server after each method: what follows is the next method's.
METHOD_END = re.compile(r"legacy-example ([\w-]+): \d+ rounds evaluated")
#: Their fit calls send the update kept at the round's norm query, which every
#: node answers by training.
KEPT_UPDATE_METHODS = {"ocs", "aocs"}


@pytest.mark.slow
# Every method in one run: minutes of Ray load, which beside a deployment
# starved the SuperLink (its database locked, the run failed): a heavy run.
@pytest.mark.usefixtures("heavy_run")
def test_every_method_runs_the_numpyclient_example_under_flwr_run(
    tmp_path: Path,
) -> None:
    output, output_dir = run_methods(
        EXAMPLE_DIR,
        tmp_path,
        methods=METHODS,
        num_supernodes=NUM_SUPERNODES,
        run_config={"num-server-rounds": ROUNDS, "num-supernodes": NUM_SUPERNODES},
    )
    tail = output[-6000:]

    history = json.loads((output_dir / "history.json").read_text())
    assert list(history) == METHODS
    for method, rows in history.items():
        assert [row["round"] for row in rows] == list(range(1, ROUNDS + 1)), method
        assert all(0.0 <= row["accuracy"] <= 1.0 for row in rows), method
    fits = FIT_LINE.findall(output)
    assert {int(partition) for partition, _ in fits} == set(range(NUM_SUPERNODES))
    # The example's fit trained exactly as often as the methods train: once
    # per fit call, except OCS's and AOCS's, which send the update kept from
    # their norm query, where every node trains once a round.
    parts = METHOD_END.split(output)
    fit_calls = {
        method: sum(int(count) for count in FIT_ROUND.findall(segment))
        for segment, method in zip(parts[0::2], parts[1::2], strict=False)
    }
    assert list(fit_calls) == METHODS, tail
    assert all(count > 0 for count in fit_calls.values()), fit_calls
    expected = sum(
        ROUNDS * NUM_SUPERNODES if method in KEPT_UPDATE_METHODS else count
        for method, count in fit_calls.items()
    )
    assert len(fits) == expected, fit_calls
