"""How many virtual SuperNodes the launcher runs, for apps with and without a say."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest
from flwr.supercore.constant import DEFAULT_SIMULATION_CONFIG

from flwr_importance.tooling import launcher
from flwr_importance.tooling.launcher import simulation, supernodes_for_run

FLOWER_EXAMPLE_PYPROJECT = """\
[tool.flwr.app]
publisher = "flwrlabs"

[tool.flwr.app.components]
serverapp = "app.server_app:app"
clientapp = "app.client_app:app"

[tool.flwr.app.config]
num-server-rounds = 3
"""


@pytest.fixture
def flower_example(tmp_path: Path) -> Path:
    """An app shaped like Flower's quickstart examples: no ``num-supernodes``."""
    app_dir = tmp_path / "quickstart"
    app_dir.mkdir()
    (app_dir / "pyproject.toml").write_text(FLOWER_EXAMPLE_PYPROJECT)
    return app_dir


def test_app_without_num_supernodes_gets_flowers_default_with_a_warning(
    flower_example: Path,
) -> None:
    with pytest.warns(UserWarning, match="--num-supernodes N"):
        count = supernodes_for_run(flower_example, None)
    assert count == DEFAULT_SIMULATION_CONFIG.num_supernodes


def test_app_without_any_config_table_gets_flowers_default(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "bare"\n')
    with pytest.warns(UserWarning, match="sets no num-supernodes"):
        count = supernodes_for_run(tmp_path, {})
    assert count == DEFAULT_SIMULATION_CONFIG.num_supernodes


@pytest.mark.filterwarnings("error")
def test_requested_then_run_config_then_app_config(
    flower_example: Path, tmp_path: Path
) -> None:
    assert supernodes_for_run(flower_example, None, requested=7) == 7
    assert supernodes_for_run(flower_example, {"num-supernodes": 5}) == 5
    preset = tmp_path / "preset.toml"
    preset.write_text("num-supernodes = 4\n")
    assert supernodes_for_run(flower_example, preset) == 4
    (flower_example / "pyproject.toml").write_text(
        FLOWER_EXAMPLE_PYPROJECT + "num-supernodes = 12\n"
    )
    assert supernodes_for_run(flower_example, None) == 12
    assert supernodes_for_run(flower_example, {"num-supernodes": 5}) == 5


def test_launcher_app_without_num_supernodes_runs_flwr_with_the_default(
    flower_example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--app <Flower example>`` once failed with a bare ``KeyError``."""
    commands: list[Sequence[str]] = []

    def fake_flwr_run(
        command: Sequence[str], *args: object, **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    # Everything up to starting processes is real: config reading, the command.
    monkeypatch.setattr(simulation, "start_managed_superlink", lambda *args: None)
    monkeypatch.setattr(simulation, "run_command", fake_flwr_run)
    argv = ["--app", str(flower_example), "--flwr-home", str(tmp_path / "home")]
    default = DEFAULT_SIMULATION_CONFIG.num_supernodes
    with pytest.warns(UserWarning, match=f"Flower's default of {default} virtual"):
        assert launcher.main(argv) == 0
    (command,) = commands
    federation_config = command[command.index("--federation-config") + 1]
    assert federation_config.startswith(f"num-supernodes={default} ")


RAY_DID_NOT_START = (
    "Exception: The current node timed out during startup. This could happen "
    "because some of the raylet failed to startup or the GCS has become overloaded."
)


@pytest.mark.parametrize(
    ("first_output", "capture", "runs"),
    [
        (RAY_DID_NOT_START, True, 2),
        ("ValueError: a bug in the app", True, 1),
        (RAY_DID_NOT_START, False, 2),
        ("ValueError: a bug in the app", False, 1),
    ],
)
def test_a_run_whose_ray_node_did_not_start_runs_once_more(
    flower_example: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    first_output: str,
    capture: bool,
    runs: int,
) -> None:
    """Only Ray's own start-up timeout is retried, once, streamed or captured."""
    outputs = [first_output, "run finished"]
    commands: list[Sequence[str]] = []

    def fake_flwr_run(
        command: Sequence[str], *args: object, **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, outputs[len(commands) - 1], "")

    monkeypatch.setattr(simulation, "start_managed_superlink", lambda *args: None)
    monkeypatch.setattr(simulation, "run_command", fake_flwr_run)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        completed = launcher.flwr_run(
            flower_example,
            num_supernodes=2,
            flwr_home=tmp_path / "home",
            capture=capture,
        )
    assert len(commands) == runs
    assert completed.stdout == outputs[runs - 1]
    retried = [w for w in caught if "start-up window" in str(w.message)]
    assert len(retried) == runs - 1


def test_a_streamed_command_is_echoed_live_and_its_tail_kept(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Streamed runs show their output and can still be checked afterwards."""
    script = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    completed = launcher.run_command(
        [sys.executable, "-c", script],
        dict(os.environ),
        tmp_path,
        capture=False,
        timeout=60,
    )
    assert completed.returncode == 0
    assert sorted(completed.stdout.splitlines()) == ["to stderr", "to stdout"]
    echoed = capfd.readouterr().out
    assert "to stdout" in echoed and "to stderr" in echoed


def test_a_streamed_command_past_its_timeout_is_killed(tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        launcher.run_command(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            dict(os.environ),
            tmp_path,
            capture=False,
            timeout=1,
        )
