"""Every strategy at 0, 10 and 30% failed replies: rounds completed, final accuracy.

Runs the real strategies and ClientApps of the simulation app on the in-process
grid with :func:`~flwr_importance.tooling.testing.fault_injection.fault_injection_mod`
failing the given fraction of replies (each failed reply raises, times out or
comes back empty, chosen per node and round from ``fault-seed``). Time-outs
lose their reply at once (``fault-delay = 0``), so no run waits. Same data,
model, seeds and faults for every strategy; each strategy's accuracy is also
given as a ratio to its own fault-free run, measured in the same run.

Flower's ``FedAvg`` (the ``fedavg`` baseline) stops the run on an empty reply
(``InconsistentMessageReplies``), so it meets only ``raise`` and ``timeout``
faults; the library's strategies meet all three kinds.

    python -m benchmarks.failures          # quick: 20 rounds, 2 seeds (~2 min)
    python -m benchmarks.failures --full   # 50 rounds, 5 seeds, 50 nodes
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from simulations.inprocess import run_inprocess
from simulations.methods import LIBRARY_METHODS

#: The section title of this benchmark in docs/results.md.
TITLE = "Every strategy under failed replies"

STRATEGIES = ("fedavg", *LIBRARY_METHODS)
FAULT_RATES = (0.0, 0.1, 0.3)
ALL_KINDS = "raise,timeout,silent"
#: Flower's FedAvg raises on an empty reply: the baseline meets the other kinds.
FLOWER_KINDS = "raise,timeout"


@dataclass(frozen=True)
class Setting:
    """Run size of one mode."""

    num_nodes: int
    rounds: int
    seeds: tuple[int, ...]


QUICK = Setting(num_nodes=20, rounds=20, seeds=(0, 1))
FULL = Setting(num_nodes=50, rounds=50, seeds=(0, 1, 2, 3, 4))


def run_once(
    strategy: str, fault_rate: float, seed: int, setting: Setting, output_dir: Path
) -> dict[str, Any]:
    """One seeded run: rounds completed and final accuracy (or the error)."""
    overrides: dict[str, bool | int | float | str] = {
        "strategy": strategy,
        "dataset": "digits",
        "partitioning": "dirichlet",
        "model": "logreg",
        "num-server-rounds": setting.rounds,
        "clients-per-round": 5,
        "local-steps": 5,
        "local-lr": 0.1,
        "seed": seed,
        "fault-rate": fault_rate,
        "fault-kinds": FLOWER_KINDS if strategy == "fedavg" else ALL_KINDS,
        "fault-seed": seed,
        "fault-delay": 0.0,
        # FedSampling's nodes draw their coins from the seed, not OS entropy,
        # so that the same seeds give the same table.
        "fedsampling-unsafe-reproducible-coins": True,
        "output-dir": str(output_dir),
    }
    try:
        rows, _ = run_inprocess(overrides, num_clients=setting.num_nodes)
    except Exception as exc:
        # A crash is a result here: the table reports it instead of stopping.
        return {"rounds": 0, "accuracy": float("nan"), "error": repr(exc)}
    return {
        "rounds": int(rows[-1]["round"]),
        "accuracy": float(rows[-1]["accuracy"]),
        "error": None,
    }


def summarize(
    runs: Mapping[str, Mapping[float, Sequence[Mapping[str, Any]]]], setting: Setting
) -> list[dict[str, Any]]:
    """Per strategy and rate: rounds completed (min over seeds), accuracy stats."""
    table = []
    for strategy, by_rate in runs.items():
        baseline = np.mean([run["accuracy"] for run in by_rate[0.0]])
        for rate, seeded in by_rate.items():
            accuracies = np.array([run["accuracy"] for run in seeded])
            table.append(
                {
                    "strategy": strategy,
                    "fault_rate": rate,
                    "rounds_completed": min(run["rounds"] for run in seeded),
                    "rounds": setting.rounds,
                    "accuracy_mean": float(accuracies.mean()),
                    "accuracy_std": float(accuracies.std()),
                    "ratio_to_no_faults": float(accuracies.mean() / baseline),
                    "errors": [run["error"] for run in seeded if run["error"]],
                }
            )
    return table


def failure_table(table: Sequence[Mapping[str, Any]]) -> str:
    """Strategy x failure rate as a markdown table."""
    columns = [
        "strategy",
        "failed replies",
        "rounds completed",
        "final accuracy",
        "vs no faults",
    ]
    cells = [
        [
            row["strategy"],
            f"{row['fault_rate']:.0%}",
            f"{row['rounds_completed']}/{row['rounds']}",
            f"{row['accuracy_mean']:.3f} ± {row['accuracy_std']:.3f}",
            f"{row['ratio_to_no_faults']:.2f}",
        ]
        for row in table
    ]
    return markdown_table(columns, cells)


def plot(table: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Final accuracy against the failure rate, one line per strategy."""
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for strategy in dict.fromkeys(row["strategy"] for row in table):
        rows = [row for row in table if row["strategy"] == strategy]
        axes.errorbar(
            [100 * row["fault_rate"] for row in rows],
            [row["accuracy_mean"] for row in rows],
            yerr=[row["accuracy_std"] for row in rows],
            marker="o",
            capsize=3,
            label=strategy,
        )
    axes.set_xlabel("failed replies (%)")
    axes.set_ylabel("final test accuracy")
    axes.set_title("Accuracy under failures (mean ± std over seeds)")
    axes.legend(fontsize=8, ncols=3)
    save_figure(figure, path)


def main(argv: Sequence[str] | None = None) -> None:
    """Run every strategy at every failure rate; write the table and the plot."""
    parser = benchmark_parser("failures", __doc__)
    args = parser.parse_args(argv)
    prepare_run()
    setting = FULL if args.full else QUICK
    args.output_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[float, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for strategy in STRATEGIES:
            runs[strategy] = {
                rate: [
                    run_once(strategy, rate, seed, setting, Path(scratch))
                    for seed in setting.seeds
                ]
                for rate in FAULT_RATES
            }
            print(f"{strategy}: done", flush=True)
    table = summarize(runs, setting)
    text = failure_table(table)
    header = (
        f"Failed replies (raise / time out / empty, per node and round): "
        f"{setting.num_nodes} nodes, 5 per round, digits (Dirichlet 0.5), "
        f"logistic regression, {setting.rounds} rounds, seeds {list(setting.seeds)}. "
        "Rounds completed: the fewest over the seeds. `fedavg` is Flower's FedAvg "
        "and meets only raise/time-out faults (an empty reply stops it)."
    )
    print(header, text, sep="\n\n", flush=True)
    plot(table, args.output_dir / "failures.png")
    results = {"setting": setting.__dict__, "table": table, "runs": runs}
    (args.output_dir / "results.json").write_text(
        json.dumps(results, indent=1, default=list)
    )
    (args.output_dir / "summary.md").write_text(
        f"{header}\n\n{text}\n\n![accuracy under failures](failures.png)\n"
    )


if __name__ == "__main__":
    main()
