"""The benchmarks' shared statistics, table and figure helpers."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
import pytest

from benchmarks.harness import (
    finite_mean,
    format_ratio,
    markdown_table,
    mean_ratio,
    mean_std,
    rounds_to_target,
    save_figure,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_markdown_table_writes_header_separator_and_rows() -> None:
    table = markdown_table(["method", "accuracy"], [["fedavg", 0.5], ["md", "0.25"]])

    assert table == (
        "| method | accuracy |\n|---|---|\n| fedavg | 0.5 |\n| md | 0.25 |"
    )


def test_markdown_table_keeps_empty_cells() -> None:
    assert markdown_table(["a", "b"], [["", "x"]]).splitlines()[-1] == "|  | x |"


def test_markdown_table_rejects_a_row_of_the_wrong_length() -> None:
    with pytest.raises(ValueError, match="row 2 has 3 cells for 2 columns"):
        markdown_table(["a", "b"], [[1, 2], [1, 2, 3]])


def test_save_figure_writes_a_png_and_closes_the_figure(tmp_path: Path) -> None:
    figure, axes = plt.subplots()
    axes.plot([0, 1], [1, 0])
    path = tmp_path / "figure.png"

    save_figure(figure, path, dpi=50)

    assert path.read_bytes().startswith(PNG_SIGNATURE)
    assert figure.number not in plt.get_fignums()


def test_rounds_to_target_is_the_first_round_reaching_it() -> None:
    accuracy = [0.1, 0.5, 0.8, 0.7, 0.9]
    assert rounds_to_target(accuracy, 0.8) == 2.0
    assert rounds_to_target(accuracy, 0.1) == 0.0
    assert math.isnan(rounds_to_target(accuracy, 0.95))
    msd = [1.0, 0.2, 0.05, 0.01]
    assert rounds_to_target(msd, 0.05, lower_is_better=True) == 2.0
    assert math.isnan(rounds_to_target(msd, 0.001, lower_is_better=True))


def test_mean_std_counts_the_seeds_that_missed() -> None:
    assert mean_std([1.0, 3.0]) == "2.000 ± 1.000"
    assert mean_std([1.0, 3.0, math.nan], digits=1) == "2.0 ± 1.0 (1 of 3 not reached)"
    assert mean_std([math.nan, math.nan], missing="never") == "never"


def test_mean_ratio_divides_the_means_of_the_seeds_that_reached() -> None:
    assert mean_ratio([3.0, math.nan, 5.0], [2.0, 2.0]) == 2.0
    assert math.isnan(mean_ratio([3.0], [0.0]))
    assert math.isnan(mean_ratio([math.nan], [2.0]))
    assert math.isnan(mean_ratio([3.0], [math.nan, math.nan]))


def test_finite_mean_skips_the_seeds_that_missed() -> None:
    assert finite_mean([2.0, math.nan, 4.0]) == 3.0
    assert math.isnan(finite_mean([math.nan]))


def test_format_ratio_writes_nan_as_not_available() -> None:
    assert format_ratio(0.754) == "0.75"
    assert format_ratio(1.5, prefix="x") == "x1.50"
    assert format_ratio(math.nan, prefix="x") == "n/a"
