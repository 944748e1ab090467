"""What the benchmarks share: command line, run set-up, tables and figures."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure


def benchmark_parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """The shared command line: ``--full`` and ``--output-dir``.

    Parameters
    ----------
    name : str
        The benchmark's name; outputs go to ``outputs/benchmarks/<name>``.
    doc : str
        The module docstring; its first line describes the command.
    """
    parser = argparse.ArgumentParser(description=(doc or name).splitlines()[0])
    parser.add_argument("--full", action="store_true", help="paper-scale runs")
    parser.add_argument(
        "--output-dir", type=Path, default=Path("outputs/benchmarks") / name
    )
    return parser


def prepare_run() -> None:
    """One torch thread and quiet Flower logs for many small in-process runs.

    The models are tiny: extra intra-op threads only oversubscribe the cores.
    Flower logs every round of every run; warnings still show.
    """
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table: the header, the separator, then one line per row.

    Parameters
    ----------
    columns : Sequence[str]
        The header cells.
    rows : Iterable[Sequence[object]]
        One sequence of cells per row, as many as ``columns``. Cells are
        written with ``str``: callers format their numbers themselves.

    Returns
    -------
    str
        The table's lines joined by newlines, without a trailing one.

    Raises
    ------
    ValueError
        If a row has more or fewer cells than ``columns``.
    """
    lines = [_table_line(columns), "|" + "---|" * len(columns)]
    for number, row in enumerate(rows, start=1):
        if len(row) != len(columns):
            raise ValueError(
                f"row {number} has {len(row)} cells for {len(columns)} columns: "
                f"{list(row)!r}"
            )
        lines.append(_table_line(row))
    return "\n".join(lines)


def _table_line(cells: Sequence[object]) -> str:
    """One markdown table line: ``| a | b |``."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def save_figure(figure: Figure, path: Path, dpi: int = 100) -> None:
    """Lay ``figure`` out, write it to ``path`` and close it.

    Parameters
    ----------
    figure : Figure
        The finished figure.
    path : Path
        The image file; its suffix picks the format.
    dpi : int
        Dots per inch of the written image.
    """
    figure.tight_layout()
    figure.savefig(path, dpi=dpi)
    # pyplot keeps every figure alive until it is closed, and a benchmark
    # draws one per setting.
    plt.close(figure)
