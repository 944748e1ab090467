"""Server time per round of every strategy with 1,000 nodes, 50 per round.

Runs :mod:`tests.e2e.load_app`: each strategy in turn for two rounds on
the same 1,000 nodes (logistic regression on Synthetic-IID, 20 samples per
node, one local step), timing ``configure_train`` + ``aggregate_train`` of
each round without the client round trips made inside them (the size and norm
queries), which are reported apart. Ratios are against Flower's ``FedAvg``
measured in the same run.

Quick mode drives the app on the in-process grid (same ServerApp code,
handlers and protobuf round trips, no Ray; ~40 s). ``--full`` runs it through
``flwr run`` on Flower's simulation engine with 1,000 virtual SuperNodes (one
Ray start for all strategies, one CPU per ClientApp; about 2 minutes on two
cores: the engine delivers about 200 messages per second and FedSampling, OCS
and MMFL reach all 1,000 nodes every round; see
:mod:`tests.e2e.load_app`).

    python -m benchmarks.load          # in-process grid
    python -m benchmarks.load --full   # flwr run, Flower's simulation engine
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
import numpy as np

from benchmarks.harness import (
    benchmark_parser,
    markdown_table,
    prepare_run,
    save_figure,
)
from tests.e2e.load_app import (
    NUM_NODES,
    STRATEGIES,
    run_load_flwr,
    run_load_inprocess,
)

BASELINE = "fedavg"


def table_rows(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per strategy: mean server seconds per round, query wait, ratio to FedAvg."""
    rows = []
    for name, method in results["methods"].items():
        rounds = method["rounds"].values()
        rows.append(
            {
                "strategy": name,
                "server_s": float(np.mean([r["server_s"] for r in rounds])),
                "configure_s": float(np.mean([r["configure_train"] for r in rounds])),
                "aggregate_s": float(np.mean([r["aggregate_train"] for r in rounds])),
                "query_wait_s": float(
                    np.mean([r["configure_train-wait"] for r in rounds])
                ),
                "per_round_server_s": [r["server_s"] for r in rounds],
                "wall_s": float(method["wall_s"]),
            }
        )
    baseline = next(row for row in rows if row["strategy"] == BASELINE)
    for row in rows:
        row["ratio"] = row["server_s"] / baseline["server_s"]
    return rows


def load_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a markdown table."""
    columns = [
        "strategy",
        "server s/round",
        "vs FedAvg",
        "configure_train s",
        "aggregate_train s",
        "per round",
        "client wait in configure s",
        "run wall s",
    ]
    cells = [
        [
            row["strategy"],
            f"{row['server_s']:.4f}",
            f"{row['ratio']:.1f}",
            f"{row['configure_s']:.4f}",
            f"{row['aggregate_s']:.4f}",
            ", ".join(f"{value:.4f}" for value in row["per_round_server_s"]),
            f"{row['query_wait_s']:.2f}",
            f"{row['wall_s']:.1f}",
        ]
        for row in rows
    ]
    return markdown_table(columns, cells)


def plot(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Server seconds per round, stacked configure/aggregate, per strategy."""
    figure, axes = plt.subplots(figsize=(8, 4))
    names = [row["strategy"] for row in rows]
    configure = [row["configure_s"] for row in rows]
    axes.bar(names, configure, label="configure_train")
    axes.bar(
        names,
        [row["aggregate_s"] for row in rows],
        bottom=configure,
        label="aggregate_train",
    )
    axes.set_ylabel("server seconds per round")
    axes.set_title(f"Server time per round, {NUM_NODES:,} nodes, 50 per round")
    axes.tick_params(axis="x", rotation=30)
    axes.legend()
    save_figure(figure, path)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the load app; write ``results.json``, ``summary.md`` and the plot."""
    parser = benchmark_parser("load", __doc__)
    args = parser.parse_args(argv)
    prepare_run()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        if args.full:
            engine = "Flower simulation engine (flwr run, Ray)"
            results = run_load_flwr(Path(scratch), STRATEGIES, timeout=1800)
        else:
            engine = "in-process grid"
            results = run_load_inprocess(STRATEGIES, Path(scratch))
    rows = table_rows(results)
    header = (
        f"{NUM_NODES:,} nodes, 50 sampled per round, 2 rounds per strategy, "
        f"{engine}. Server time: configure_train + aggregate_train without the "
        "client round trips inside configure_train (reported apart); FedSampling "
        "aggregates all 1,000 nodes' updates, the others 50. Timings vary between "
        "machines and runs."
    )
    text = load_table(rows)
    print(header, text, sep="\n\n", flush=True)
    plot(rows, args.output_dir / "load.png")
    (args.output_dir / "results.json").write_text(
        json.dumps({"engine": engine, "results": results, "table": rows}, indent=1)
    )
    (args.output_dir / "summary.md").write_text(
        f"{header}\n\n{text}\n\n![server time per round](load.png)\n"
    )


if __name__ == "__main__":
    main()
