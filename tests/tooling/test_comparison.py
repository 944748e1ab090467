"""The ``--compare`` table: target from the baseline, rounds to it, files written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flwr_importance.tooling.comparison import (
    compare_histories,
    format_table,
    plot_comparison,
    write_comparison,
)


def history(accuracies: list[float], losses: list[float]) -> list[dict[str, float]]:
    """History rows from per-round accuracies and losses, round 0 first."""
    return [
        {"round": index, "accuracy": accuracy, "loss": loss}
        for index, (accuracy, loss) in enumerate(zip(accuracies, losses, strict=True))
    ]


BASELINE = history([0.1, 0.5, 0.7, 0.6, 0.8], [2.3, 1.9, 1.5, 1.6, 1.2])
FASTER = history([0.1, 0.75, 0.8, 0.85, 0.9], [2.3, 1.4, 1.2, 1.1, 1.0])
NEVER = history([0.1, 0.2, 0.3, 0.4, 0.5], [2.3, 2.2, 2.1, 2.0, 1.9])


def test_target_comes_from_the_baseline_final_accuracy_only() -> None:
    result = compare_histories({"md": BASELINE, "clustered": FASTER, "other": NEVER})
    # 90% of md's final 0.8; the others' curves play no part.
    assert result.target == pytest.approx(0.72)
    assert "90% of md's final accuracy 0.8" in result.target_rule
    assert compare_histories({"md": BASELINE}).target == result.target
    assert [row.strategy for row in result.results] == ["md", "clustered", "other"]
    # md first reaches 0.72 at round 4 (0.7 at round 2 is short of it).
    assert [row.rounds_to_target for row in result.results] == [4, 1, None]
    assert [row.final_quality for row in result.results] == [0.8, 0.9, 0.5]
    assert [row.final_loss for row in result.results] == [1.2, 1.0, 1.9]


def test_order_decides_the_baseline() -> None:
    result = compare_histories({"clustered": FASTER, "md": BASELINE})
    assert result.target == pytest.approx(0.81)
    assert [row.rounds_to_target for row in result.results] == [3, None]


def test_msd_target_is_lower_is_better() -> None:
    def msd_history(values: list[float]) -> list[dict[str, float]]:
        return [
            {"round": index, "msd": value, "loss": value}
            for index, value in enumerate(values)
        ]

    result = compare_histories(
        {"fedavg": msd_history([1.0, 0.5, 0.2, 0.1]), "is": msd_history([1.0, 0.1])}
    )
    assert result.metric == "msd"
    assert result.target == pytest.approx(0.1 / 0.9)
    assert [row.rounds_to_target for row in result.results] == [3, 1]


def test_table_shows_misses_ratios_and_the_rule() -> None:
    table = format_table(
        compare_histories({"md": BASELINE, "clustered": FASTER, "other": NEVER})
    )
    lines = table.splitlines()
    assert lines[0].startswith("target: accuracy >= 0.72")
    assert (
        lines[2]
        == "| strategy | rounds to target | vs md | final accuracy | final loss |"
    )
    assert lines[4] == "| md (baseline) | 4 | x1.00 | 0.8000 | 1.2000 |"
    assert lines[5] == "| clustered | 1 | x0.25 | 0.9000 | 1.0000 |"
    assert lines[6] == "| other | > 4 (missed) | n/a | 0.5000 | 1.9000 |"


@pytest.mark.parametrize(
    ("histories", "message"),
    [
        ({}, "no histories"),
        ({"md": []}, "empty history"),
        ({"md": [{"round": 0, "loss": 1.0}]}, "none of"),
        (
            {"md": BASELINE, "is": [{"round": 0, "msd": 1.0, "loss": 1.0}]},
            "different quality metrics",
        ),
    ],
)
def test_bad_histories_are_refused(
    histories: dict[str, list[dict[str, float]]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        compare_histories(histories)


def test_target_fraction_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="target_fraction"):
        compare_histories({"md": BASELINE}, target_fraction=1.5)


def test_json_and_plot_are_written(tmp_path: Path) -> None:
    histories = {"md": BASELINE, "clustered": FASTER}
    result = compare_histories(histories)
    json_path = write_comparison(
        result,
        tmp_path / "comparison.json",
        run_config={"seed": 0},
        output_dirs={name: tmp_path / name for name in histories},
    )
    document = json.loads(json_path.read_text())
    assert document["baseline"] == "md"
    assert document["target"] == pytest.approx(0.72)
    assert document["run_config"] == {"seed": 0}
    assert [row["rounds_to_target"] for row in document["results"]] == [4, 1]
    assert document["results"][1]["output_dir"] == str(tmp_path / "clustered")
    plot_path = plot_comparison(histories, result, tmp_path / "comparison.png", "t")
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
