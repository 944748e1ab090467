"""End to end: a multi-model MMFL run through a real ``flwr run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flwr_importance.launcher import flwr_run, processes_mentioning

APP_DIR = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_flwr_run_mmfl_writes_per_model_history_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    output_dir = tmp_path / "out"
    flwr_home = tmp_path / "flwr-home"
    completed = flwr_run(
        APP_DIR,
        num_supernodes=6,
        run_config={
            "strategy": "mmfl",
            "mmfl-variant": "gradnorm",
            "mmfl-tasks": "digits:pathological:2,synthetic-1-1",
            "model": "logreg",
            "num-server-rounds": 2,
            "clients-per-round": 3,
            "local-steps": 3,
            "output-dir": str(output_dir),
        },
        flwr_home=flwr_home,
        capture=True,
        timeout=300,
    )
    log = completed.stdout[-4000:] + completed.stderr[-4000:]
    assert completed.returncode == 0, log
    rows = json.loads((output_dir / "history.json").read_text())
    assert [row["round"] for row in rows] == [0, 1, 2]
    for row in rows:
        per_model = [row["accuracy-0"], row["accuracy-1"]]
        assert row["accuracy"] == pytest.approx(sum(per_model) / 2)
    assert rows[-1]["num-received"] >= 1
    assert (output_dir / "convergence.png").stat().st_size > 0
    assert processes_mentioning(str(flwr_home.resolve())) == []
