"""``compare_strategies`` around ``flwr_run``: what each run gets, what is read back."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from flwr_importance.tooling import launcher
from flwr_importance.tooling.launcher import RunFailedError, compare, compare_strategies

APP_DIR = Path(__file__).resolve().parents[3]
#: Accuracy per round each fake run reports, by strategy.
CURVES = {"md": [0.1, 0.5, 0.6], "clustered": [0.1, 0.7, 0.8]}


class FakeFlwrRun:
    """Records each call and writes the strategy's history where it was told."""

    def __init__(self, *, write_history: bool = True, returncode: int = 0) -> None:
        self.calls: list[dict[str, object]] = []
        self.write_history = write_history
        self.returncode = returncode

    def __call__(
        self, app_dir: Path, *, run_config: Mapping[str, object], **kwargs: object
    ) -> subprocess.CompletedProcess[str]:
        self.calls.append({"app_dir": app_dir, "run_config": run_config, **kwargs})
        output_dir = Path(str(run_config["output-dir"]))
        if self.write_history:
            output_dir.mkdir(parents=True, exist_ok=True)
            rows = [
                {"round": index, "accuracy": accuracy, "loss": 1 - accuracy}
                for index, accuracy in enumerate(CURVES[str(run_config["strategy"])])
            ]
            (output_dir / "history.json").write_text(json.dumps(rows))
        return subprocess.CompletedProcess([], self.returncode, "log tail", "")


@pytest.fixture
def preset(tmp_path: Path) -> Path:
    path = tmp_path / "preset.toml"
    path.write_text('strategy = "clustered"\nseed = 7\nnum-supernodes = 6\n')
    return path


def test_every_run_gets_the_same_config_but_strategy_and_output_dir(
    tmp_path: Path, preset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeFlwrRun()
    monkeypatch.setattr(compare, "flwr_run", fake)
    out = tmp_path / "out"
    result = compare_strategies(
        APP_DIR, ["md", "clustered"], run_config=preset, output_dir=out
    )
    assert [call["run_config"] for call in fake.calls] == [
        {
            "strategy": "md",
            "seed": 7,
            "num-supernodes": 6,
            "output-dir": str(out / "md"),
        },
        {
            "strategy": "clustered",
            "seed": 7,
            "num-supernodes": 6,
            "output-dir": str(out / "clustered"),
        },
    ]
    assert {call["num_supernodes"] for call in fake.calls} == {6}
    assert [row.rounds_to_target for row in result.comparison.results] == [2, 1]
    assert result.output_dirs == {"md": out / "md", "clustered": out / "clustered"}
    assert result.json_path == out / "comparison.json"
    assert result.plot_path.is_file()
    assert "md vs clustered: preset.toml, 6 SuperNodes, seed 7" in result.table


def test_a_run_without_history_fails_even_if_an_old_history_is_there(
    tmp_path: Path, preset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    (out / "md").mkdir(parents=True)
    (out / "md" / "history.json").write_text("[]")  # from an earlier run
    fake = FakeFlwrRun(write_history=False)
    monkeypatch.setattr(compare, "flwr_run", fake)
    with pytest.raises(RunFailedError, match="strategy=md wrote no"):
        compare_strategies(
            APP_DIR, ["md", "clustered"], run_config=preset, output_dir=out
        )
    assert len(fake.calls) == 1  # the runs after a failure are not started


def test_a_failed_run_stops_the_comparison_with_its_log(
    tmp_path: Path, preset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeFlwrRun(returncode=1)
    monkeypatch.setattr(compare, "flwr_run", fake)
    with pytest.raises(RunFailedError, match="exited with 1\nlog tail"):
        compare_strategies(
            APP_DIR, ["md", "clustered"], run_config=preset, output_dir=tmp_path
        )
    assert len(fake.calls) == 1


@pytest.mark.parametrize("strategies", [["md"], ["md", "md"], []])
def test_needs_two_distinct_strategies(strategies: list[str]) -> None:
    with pytest.raises(ValueError, match="two or more distinct"):
        compare_strategies(APP_DIR, strategies)


def test_cli_reports_a_bad_strategy_list_without_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeFlwrRun()
    monkeypatch.setattr(compare, "flwr_run", fake)
    assert launcher.main(["--compare", "md"]) == 1
    assert "two or more distinct" in capsys.readouterr().err
    assert fake.calls == []
