"""``--compare`` end to end: two strategies, each through a real ``flwr run``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flwr_importance.tooling.launcher import (
    COMPARISON_JSON,
    COMPARISON_PLOT,
    processes_mentioning,
    processes_with_environment,
)
from simulations.inprocess import APP_DIR, load_preset

pytestmark = pytest.mark.slow

#: The main job's preset, cut to a few rounds on a few SuperNodes.
SMALL_MAIN = {
    **load_preset("main"),
    "num-supernodes": 6,
    "clients-per-round": 3,
    "num-server-rounds": 2,
}


def write_preset(path: Path, values: dict[str, bool | int | float | str]) -> Path:
    """Write flat run-config ``values`` as a preset TOML file."""

    def toml_value(value: bool | int | float | str) -> str:
        # JSON's strings and numbers are TOML's; its booleans are not spelled alike.
        return str(value).lower() if isinstance(value, bool) else json.dumps(value)

    path.write_text("".join(f"{key} = {toml_value(v)}\n" for key, v in values.items()))
    return path


def processes_under(flwr_home: Path) -> dict[int, str]:
    """Processes of runs under ``flwr_home`` (by environment or command line)."""
    home = str(flwr_home.resolve())
    pids = set(processes_with_environment("FLWR_HOME", home))
    pids.update(processes_mentioning(home))
    found = {}
    for pid in sorted(pids):
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
        except OSError:  # exited meanwhile
            continue
    return found


def simulation_running(flwr_home: Path) -> bool:
    """Whether a ``flwr-simulation`` process runs under ``flwr_home``."""
    return any(
        "flwr-simulation" in line for line in processes_under(flwr_home).values()
    )


def launcher_command(preset: Path, output_dir: Path, flwr_home: Path) -> list[str]:
    """``python -m flwr_importance.tooling.launcher --compare md,clustered ...``."""
    return [
        sys.executable,
        "-m",
        "flwr_importance.tooling.launcher",
        "--compare",
        "md,clustered",
        "--run-config",
        str(preset),
        "--output-dir",
        str(output_dir),
        "--flwr-home",
        str(flwr_home),
    ]


def test_compare_prints_the_table_writes_the_plot_and_stops_everything(
    tmp_path: Path,
) -> None:
    preset = write_preset(tmp_path / "small-main.toml", SMALL_MAIN)
    output_dir, flwr_home = tmp_path / "out", tmp_path / "flwr-home"
    completed = subprocess.run(
        launcher_command(preset, output_dir, flwr_home),
        cwd=APP_DIR,
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    log = completed.stdout[-4000:] + completed.stderr[-4000:]
    assert completed.returncode == 0, log
    assert processes_under(flwr_home) == {}

    document = json.loads((output_dir / COMPARISON_JSON).read_text())
    assert document["baseline"] == "md"
    assert document["run_config"]["seed"] == SMALL_MAIN["seed"]
    results = {row["strategy"]: row for row in document["results"]}
    assert list(results) == ["md", "clustered"]
    for strategy, row in results.items():
        history = json.loads((output_dir / strategy / "history.json").read_text())
        assert [entry["round"] for entry in history] == [0, 1, 2]
        assert row["rounds"] == 2
        assert row["final_quality"] == history[-1]["accuracy"]
        assert row["output_dir"] == str(output_dir / strategy)
    # Same seed and data: both runs start from the same initial model.
    initial = {
        strategy: json.loads((output_dir / strategy / "history.json").read_text())[0]
        for strategy in results
    }
    assert initial["md"] == initial["clustered"]
    assert document["target"] == pytest.approx(0.9 * results["md"]["final_quality"])

    table = completed.stdout[completed.stdout.index("target: accuracy >= ") :]
    assert "| strategy | rounds to target | vs md | final accuracy | final loss |" in (
        table
    )
    assert f"| md (baseline) | {results['md']['rounds_to_target']} |" in table
    assert "| clustered | " in table
    assert (output_dir / COMPARISON_PLOT).read_bytes()[:4] == b"\x89PNG"


def test_ctrl_c_during_a_run_stops_everything_it_started(tmp_path: Path) -> None:
    preset = write_preset(
        tmp_path / "long-main.toml", {**SMALL_MAIN, "num-server-rounds": 500}
    )
    flwr_home, log_path = tmp_path / "flwr-home", tmp_path / "launcher.log"
    with log_path.open("w") as log_file:
        launcher = subprocess.Popen(
            launcher_command(preset, tmp_path / "out", flwr_home),
            cwd=APP_DIR,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            # A terminal's Ctrl-C signals the whole foreground process group.
            start_new_session=True,
            # Background shells start jobs with SIGINT ignored; a terminal does not.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        deadline = time.monotonic() + 300
        # Interrupt once the simulation (and so Ray) runs under the SuperLink.
        while not simulation_running(flwr_home):
            assert launcher.poll() is None, log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, "the simulation never started"
            time.sleep(0.5)
        os.killpg(launcher.pid, signal.SIGINT)
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    output = log_path.read_text()
    assert launcher.returncode == 130, output[-4000:]
    assert "Interrupted" in output
    assert processes_under(flwr_home) == {}
