"""The benchmarks' shared table and figure helpers."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
import pytest

from benchmarks.harness import markdown_table, save_figure

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
