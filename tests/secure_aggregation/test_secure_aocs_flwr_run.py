"""AOCS under SecAgg+ through ``flwr run``: the done-when test of issue 27, part 2.

The test app (``tests/secure_aggregation/aocs_app``) runs AOCS with
``SecureAOCSWorkflow`` and then in the clear, on the same virtual SuperNodes
and seeds, in one ``flwr run`` (node ids are new in every run, and AOCS's
draws follow the sorted node ids, so two runs would sample different
partitions). Slow: one Ray start-up, under a minute.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flwr_importance.tooling.launcher import flwr_run, processes_mentioning

APP_DIR = Path(__file__).resolve().parent / "aocs_app"


@pytest.mark.slow
@pytest.mark.usefixtures("heavy_run")
def test_flwr_run_of_secure_aocs_gives_the_plain_models(tmp_path: Path) -> None:
    """Each round's model matches the plain run's within the logged bounds.

    Rounds are compared while both runs stepped (a round with fewer than 2
    participants keeps the secure model and moves the plain one); with 4 of
    5 nodes expected, round 1 has at least 2 but with a negligible chance.
    """
    flwr_home = tmp_path / "flwr-home"
    completed = flwr_run(
        APP_DIR,
        num_supernodes=5,
        run_config={"output-dir": str(tmp_path), "clients-per-round": 4},
        flwr_home=flwr_home,
        capture=True,
        timeout=600,
        federation_config={"client-resources-num-cpus": 1},
    )
    assert processes_mentioning(str(flwr_home.resolve())) == []
    log = completed.stdout[-4000:] + completed.stderr[-4000:]
    assert completed.returncode == 0, log
    runs = json.loads((tmp_path / "models.json").read_text())
    secure, plain = runs["secure"], runs["plain"]
    sampled = [count for _, count in secure["metrics"]["num-sampled"]]
    assert sampled == [count for _, count in plain["metrics"]["num-sampled"]]
    stepped = next(
        (index for index, count in enumerate(sampled) if count < 2), len(sampled)
    )
    assert stepped >= 1, sampled
    bounds = np.cumsum([bound for _, bound in secure["metrics"]["quantization-bound"]])
    for round_index in range(stepped):
        secure_model = secure["models"][round_index + 1]
        plain_model = plain["models"][round_index + 1]
        difference = max(
            float(np.max(np.abs(np.subtract(a, b))))
            for a, b in zip(secure_model, plain_model, strict=True)
        )
        assert 0 < difference <= bounds[round_index], (round_index, difference)
