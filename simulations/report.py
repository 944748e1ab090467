"""``history.json`` and the convergence plot the ServerApp writes."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
from flwr.serverapp.strategy import Result

HistoryRow = dict[str, float]


def history_rows(result: Result) -> list[HistoryRow]:
    """One row per centrally evaluated round: its metrics and the strategy's.

    The strategy's round metrics (``aggregate_train``'s MetricRecord) keep their
    names; one that clashes with a central metric is prefixed ``clients-``.
    """
    rows = []
    for server_round, central in sorted(result.evaluate_metrics_serverapp.items()):
        row: HistoryRow = {"round": server_round}
        row.update({key: float(value) for key, value in central.items()})  # type: ignore[arg-type]
        for key, value in result.train_metrics_clientapp.get(server_round, {}).items():
            if isinstance(value, (int, float)):
                row[key if key not in row else f"clients-{key}"] = float(value)
        rows.append(row)
    return rows


def write_history(rows: list[HistoryRow], output_dir: Path) -> Path:
    """Write ``history.json`` (a JSON list of rows) into ``output_dir``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "history.json"
    path.write_text(json.dumps(rows, indent=1))
    return path


def plot_history(rows: list[HistoryRow], output_dir: Path, title: str) -> Path:
    """Plot the central loss and accuracy (or MSD) per round to a PNG."""
    output_dir.mkdir(parents=True, exist_ok=True)
    quality = "accuracy" if "accuracy" in rows[0] else "msd"
    rounds = [row["round"] for row in rows]
    figure, (loss_axes, quality_axes) = plt.subplots(1, 2, figsize=(10, 4))
    loss_axes.plot(rounds, [row["loss"] for row in rows], marker=".")
    loss_axes.set(xlabel="round", ylabel="central test loss")
    quality_axes.plot(rounds, [row[quality] for row in rows], marker=".")
    quality_axes.set(xlabel="round", ylabel=f"central test {quality}")
    if quality == "msd":
        quality_axes.set_yscale("log")
    figure.suptitle(title)
    figure.tight_layout()
    path = output_dir / "convergence.png"
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
