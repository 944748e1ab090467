"""``history.json`` and the convergence plot the ServerApp writes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
from flwr.app import MetricRecord
from flwr.serverapp.strategy import Result

from flwr_importance.sampling.ledger import PrivacyLedger

#: A history row's privacy ledger (:func:`privacy_entry`): numbers, and
#: per-node columns (node ids as exact integers).
PrivacyEntry = dict[str, float | str | list[int] | list[float]]
#: One round of ``history.json``: numbers by name, and a PrivacyEntry under
#: :data:`PRIVACY_LEDGER` (``Any``: readers index the numbers they know).
HistoryRow = dict[str, Any]

#: The key of a row's privacy ledger.
PRIVACY_LEDGER = "privacy-ledger"
#: The cumulative epsilon and delta of central DP, in the round metrics of the
#: central-DP wrapper (strategies/central_dp.py), carried into the ledger.
CENTRAL_DP_METRICS = ("dp-epsilon", "dp-delta")


def history_rows(
    result: Result, privacy_ledger: PrivacyLedger | None = None
) -> list[HistoryRow]:
    """One row per centrally evaluated round: its metrics and the strategy's.

    The strategy's round metrics (``aggregate_train``'s MetricRecord) keep their
    names; one that clashes with a central metric is prefixed ``clients-``.
    With a ``privacy_ledger`` (FedSampling's) or central DP's metrics, a row
    also holds :func:`privacy_entry` under :data:`PRIVACY_LEDGER`.
    """
    rows = []
    for server_round, central in sorted(result.evaluate_metrics_serverapp.items()):
        row: HistoryRow = {"round": server_round}
        row.update({key: float(value) for key, value in central.items()})  # type: ignore[arg-type]
        train_metrics = result.train_metrics_clientapp.get(server_round, MetricRecord())
        for key, value in train_metrics.items():
            if isinstance(value, (int, float)):
                row[key if key not in row else f"clients-{key}"] = float(value)
        entry = privacy_entry(server_round, train_metrics, privacy_ledger)
        if entry:
            row[PRIVACY_LEDGER] = entry
        rows.append(row)
    return rows


def privacy_entry(
    server_round: int,
    train_metrics: Mapping[str, object],
    privacy_ledger: PrivacyLedger | None,
) -> PrivacyEntry:
    """The privacy spent up to the end of ``server_round``, as a row holds it.

    From ``privacy_ledger``: ``size-query-epsilon`` (one size reply's LDP
    budget), ``delta-prime``, and per node that has answered a size query
    (ascending ids) ``node-ids``, ``size-queries`` (``k``),
    ``basic-epsilon`` (``k eps``) and ``advanced-epsilon`` (the advanced
    composition bound at ``delta-prime``, or ``k eps`` where smaller), and
    the nodes' own ledgers (:func:`node_ledger_columns`). From
    the round's metrics, when central DP reports them: ``dp-epsilon`` and
    ``dp-delta``. Empty when there is neither.
    """
    entry: PrivacyEntry = {}
    if privacy_ledger is not None:
        spend = privacy_ledger.spend(server_round)
        entry.update(
            {
                "size-query-epsilon": privacy_ledger.epsilon,
                "delta-prime": privacy_ledger.delta_prime,
                "node-ids": list(spend.node_ids),
                "size-queries": list(spend.size_queries),
                "basic-epsilon": list(spend.basic_epsilon),
                "advanced-epsilon": list(spend.advanced_epsilon),
            }
        )
        entry.update(node_ledger_columns(privacy_ledger, server_round))
    for key in CENTRAL_DP_METRICS:
        value = train_metrics.get(key)
        if isinstance(value, (int, float)):
            entry[key] = float(value)
    return entry


#: What a row says when any node drew its coins from replayable seeded streams.
REPRODUCIBLE_COINS_NOTE = (
    "nodes drew their coins from seeded streams the server can replay "
    "(fedsampling-unsafe-reproducible-coins): this ledger is not a privacy "
    "guarantee"
)


def node_ledger_columns(ledger: PrivacyLedger, server_round: int) -> PrivacyEntry:
    """The nodes' own ledgers, as their latest size replies up to the round said.

    ``node-ledger-ids`` (ascending), ``node-ledger-answers`` and
    ``node-ledger-epsilon`` (each node's own count of its replies and their
    epsilon, basic composition), and ``reproducible-coins`` (1 when any node
    said its coins were seeded) with :data:`REPRODUCIBLE_COINS_NOTE`.
    """
    reports = sorted(ledger.latest_node_reports(server_round).items())
    columns: PrivacyEntry = {
        "node-ledger-ids": [node_id for node_id, _ in reports],
        "node-ledger-answers": [report.answers for _, report in reports],
        "node-ledger-epsilon": [report.epsilon_spent for _, report in reports],
    }
    reproducible = any(report.reproducible_coins for _, report in reports)
    columns["reproducible-coins"] = float(reproducible)
    if reproducible:
        columns["note"] = REPRODUCIBLE_COINS_NOTE
    return columns


def privacy_ledger_of(strategy: object) -> PrivacyLedger | None:
    """The strategy's ``privacy_ledger``, looked for through wrappers.

    A wrapping strategy (Flower's DP wrappers, the legacy adapter) holds the
    wrapped one as ``.strategy``. None: no strategy in the chain keeps one.
    """
    while strategy is not None:
        ledger = getattr(strategy, "privacy_ledger", None)
        if isinstance(ledger, PrivacyLedger):
            return ledger
        strategy = getattr(strategy, "strategy", None)
    return None


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
