"""What the benchmarks share: command line, run set-up, statistics, tables, figures.

The rules of a fair comparison (seeds, targets, intervals, verdicts, claim rows)
live in :mod:`benchmarks.evidence`.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
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


def start_benchmark(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, Path]:
    """Parse ``argv``, :func:`prepare_run` and create the output folder.

    Returns the parsed arguments and ``--output-dir``.
    """
    args = parser.parse_args(argv)
    prepare_run()
    out: Path = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    return args, out


def format_ratio(ratio: float, prefix: str = "") -> str:
    """A ratio with two decimals after ``prefix``; ``n/a`` where it is NaN."""
    return f"{prefix}{ratio:.2f}" if np.isfinite(ratio) else "n/a"


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


def rounds_to_target(
    curve: Sequence[float], target: float, *, lower_is_better: bool = False
) -> float:
    """The first round whose value reaches ``target``.

    Parameters
    ----------
    curve : Sequence[float]
        One value per round, round 0 (the initial model) first.
    target : float
        The value to reach: at least it (accuracy) or at most it
        (``lower_is_better``: loss, error, MSD).
    lower_is_better : bool
        Whether smaller values are better.

    Returns
    -------
    float
        The round's index in ``curve``, NaN if no round reaches ``target``.
    """
    values = np.asarray(curve, dtype=np.float64)
    reached = np.flatnonzero(values <= target if lower_is_better else values >= target)
    return float(reached[0]) if reached.size else float("nan")


def finite_mean(values: Sequence[float]) -> float:
    """Mean of the finite values (the seeds that reached a target); NaN if none."""
    finite = [value for value in values if np.isfinite(value)]
    return float(np.mean(finite)) if finite else float("nan")


def mean_std(
    values: Sequence[float], digits: int = 3, missing: str = "not reached"
) -> str:
    """``mean ± std`` over seeds of the finite values, saying how many are not.

    Parameters
    ----------
    values : Sequence[float]
        One value per seed; NaN where a seed has none (a target not reached).
    digits : int
        Decimals of the mean and the standard deviation.
    missing : str
        What a NaN means, for the count and for an all-NaN result.

    Returns
    -------
    str
        ``"0.812 ± 0.013"`` (population standard deviation over the seeds),
        ``"12.000 ± 1.000 (1 of 3 not reached)"``, or ``missing`` alone.
    """
    finite = np.asarray([value for value in values if np.isfinite(value)])
    if finite.size == 0:
        return missing
    text = f"{finite.mean():.{digits}f} ± {finite.std():.{digits}f}"
    if finite.size < len(values):
        text += f" ({len(values) - finite.size} of {len(values)} {missing})"
    return text


def mean_ratio(values: Sequence[float], baseline: Sequence[float]) -> float:
    """The mean of the finite ``values`` over the mean of the finite ``baseline``.

    Parameters
    ----------
    values, baseline : Sequence[float]
        One value per seed each; NaN where a seed has none (a target not
        reached), left out of its mean.

    Returns
    -------
    float
        The ratio of the means; NaN when either side has no finite value or
        the baseline's mean is 0.
    """
    value, base = finite_mean(values), finite_mean(baseline)
    if not (np.isfinite(value) and np.isfinite(base)) or base == 0:
        return float("nan")
    return value / base
