"""End to end: the legacy-API example through a real ``flwr run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flwr_importance.launcher import flwr_run, processes_mentioning

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "legacy"


@pytest.mark.slow
def test_flwr_run_legacy_example_with_ocs_learns_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    # OCS uses every legacy channel: its norm query is a ClientProxy.fit from
    # inside configure_fit, its train reply the update kept in context.state.
    flwr_home = tmp_path / "flwr-home"
    output_dir = tmp_path / "out"
    num_supernodes = 6
    try:
        completed = flwr_run(
            EXAMPLE_DIR,
            num_supernodes=num_supernodes,
            run_config={
                "strategy": "ocs",
                "num-server-rounds": 4,
                "clients-per-round": 3,
                "num-supernodes": num_supernodes,
                "output-dir": str(output_dir),
            },
            flwr_home=flwr_home,
            capture=True,
            timeout=120,
        )
    finally:
        assert processes_mentioning(str(flwr_home.resolve())) == []
    log = completed.stdout[-4000:] + completed.stderr[-4000:]
    assert completed.returncode == 0, log
    assert f"query.norm: {num_supernodes} usable replies" in completed.stdout, log
    rows = json.loads((output_dir / "history.json").read_text())
    assert [row["round"] for row in rows] == [0, 1, 2, 3, 4]
    assert rows[-1]["accuracy"] > rows[0]["accuracy"] + 0.4, rows
