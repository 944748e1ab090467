"""Client time per round of every method's ClientApp against a plain FedAvg client.

Every method runs the simulation app's real ClientApp on the in-process grid
with the same model (``mlp``), data (digits, 2 classes per node), nodes and
local work (``local-steps`` SGD steps of ``batch-size`` samples; ISFedAvg's
``E_k``/``B_k`` and FedSampling's local steps are pinned to the same values;
MMFL trains one model, the same one). Only the time inside the ClientApp is
counted (a :class:`TimedClientApp` wraps it; serialization and the server are
not), per message type, over the whole run, divided by the rounds.

Two ratios against FedAvg, measured in the same run:

- per round: all the client work of a round (OCS and MMFL-gradnorm train on
  every node in ``query.norm``, FedSampling sends ``train`` to every node);
- per ``train`` message: the cost of one participant's training handler
  (FOLB adds a full local gradient, ISFedAvg per-sample gradient norms). OCS
  and MMFL-gradnorm train in ``query.norm``; their ``train`` only sends the
  kept update, so their cost is in the per-round column.

At scale (:data:`SCALE_NODES` nodes, in process, on generated data: the
1,437 digits cannot be split over 1,000 nodes) a second table gives, per
method, the client *trainings* per round (local training runs: ``train``
messages that train, and each model a ``query.norm`` trains; OCS's and
MMFL-gradnorm's ``train`` only sends the kept update) and the client seconds
per round, against FedAvg's. OCS and AOCS appear with an available pool of
``POOL_FACTOR * m`` nodes too, the cross-device setting that trains the pool
only.

    python -m benchmarks.client_overhead         # quick: 5 rounds, 20 nodes; 2 at 1,000
    python -m benchmarks.client_overhead --full  # 10 rounds, 50 nodes; 3 at 1,000
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from benchmarks.harness import (
    benchmark_parser,
    markdown_table,
    prepare_run,
    save_figure,
)
from flwr_importance.registry import RunConfigValue, methods
from flwr_importance.tooling.declarations import LocalWork
from flwr_importance.tooling.testing import InProcessGrid
from simulations.client_app import app as simulation_client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.server_app import run_experiment
from simulations.tooling import declaration

#: The section title of this benchmark in docs/results.md.
TITLE = "Client time per round vs a FedAvg client"

LOCAL_STEPS = 10
BATCH_SIZE = 16
CLIENTS_PER_ROUND = 5
BASELINE = "fedavg"
#: Nodes of the scale table, and its data: generated, 40 samples per node.
SCALE_NODES = 1_000
SCALE_DATA: dict[str, bool | int | float | str] = {
    "dataset": "synthetic-1-1",
    "partitioning": "iid",
    "samples-per-client": 40,
}
#: The available pool of the pooled OCS/AOCS rows, in multiples of ``m``.
POOL_FACTOR = 4

COMMON: dict[str, bool | int | float | str] = {
    "dataset": "digits",
    "partitioning": "pathological",
    "classes-per-client": 2,
    "model": "mlp",
    "clients-per-round": CLIENTS_PER_ROUND,
    "local-steps": LOCAL_STEPS,
    "local-epochs": 0,
    "batch-size": BATCH_SIZE,
    "heterogeneous-steps": False,
}
#: Each method's run-config overrides (same local work as FedAvg): Flower's
#: FedAvg and every registry method (once: an alias would repeat its run).
METHODS: dict[str, Mapping[str, RunConfigValue]] = {
    "fedavg": {"strategy": "fedavg"},
    **{
        spec.name: {
            "strategy": spec.name,
            **declaration(spec.name).equal_work(
                LocalWork(LOCAL_STEPS, BATCH_SIZE, CLIENTS_PER_ROUND)
            ),
        }
        for spec in methods()
    },
}
#: OCS and AOCS with an available pool: only the pool trains (scale table).
POOLED: dict[str, Mapping[str, RunConfigValue]] = {
    "ocs-pool": {"strategy": "ocs", "ocs-pool-size": POOL_FACTOR * CLIENTS_PER_ROUND},
    "aocs-pool": {
        "strategy": "ocs",
        "ocs-approximate": True,
        "ocs-pool-size": POOL_FACTOR * CLIENTS_PER_ROUND,
    },
}


def trainings(message: Message) -> int:
    """The local training runs ``message`` asks of a node.

    A ``query.norm`` trains each model it carries; a ``train`` message trains
    unless it asks for the update kept from the norm query.
    """
    message_type = message.metadata.message_type
    if message_type == "query.norm":
        return len(message.content.array_records)
    if message_type == "train":
        configs = message.content.config_records.values()
        kept = any(bool(config.get("kept-update", False)) for config in configs)
        return 0 if kept else 1
    return 0


class TimedClientApp(ClientApp):
    """A ClientApp that runs ``inner`` and adds up its time per message type."""

    def __init__(self, inner: ClientApp) -> None:
        super().__init__()
        self.inner = inner
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self.trainings = 0

    def __call__(self, message: Message, context: Context) -> Message:
        """Run the wrapped ClientApp on ``message``, timing it."""
        self.trainings += trainings(message)
        start = time.perf_counter()
        try:
            return self.inner(message, context)
        finally:
            message_type = message.metadata.message_type
            self.seconds[message_type] += time.perf_counter() - start
            self.calls[message_type] += 1


@dataclass(frozen=True)
class ClientCost:
    """One method's client time, per round and per message type."""

    method: str
    rounds: int
    seconds: Mapping[str, float]
    calls: Mapping[str, int]
    trainings: int = 0

    @property
    def per_round(self) -> float:
        """All ClientApp seconds of a round (every node, every message type)."""
        return sum(self.seconds.values()) / self.rounds

    @property
    def per_train(self) -> float:
        """Mean seconds of one ``train`` message."""
        return self.seconds.get("train", 0.0) / max(self.calls.get("train", 0), 1)


def measure(
    method: str,
    num_nodes: int,
    rounds: int,
    seed: int,
    output_dir: Path,
    data: Mapping[str, RunConfigValue] | None = None,
) -> ClientCost:
    """Run ``method`` for ``rounds`` rounds; the time spent in its ClientApp.

    ``data`` overrides the dataset settings of :data:`COMMON`.
    """
    run_config = resolve_run_config(
        {
            **COMMON,
            **(data or {}),
            **{**METHODS, **POOLED}[method],
            "num-server-rounds": rounds,
            "num-supernodes": num_nodes,
            "seed": seed,
            "output-dir": str(output_dir / "runs" / method),
        }
    )
    timed_app = TimedClientApp(simulation_client_app)
    # Serialization would be counted as neither side's work: skip it.
    grid = InProcessGrid(timed_app, num_nodes, run_config, seed=seed, serialize=False)
    run_experiment(grid, ExperimentConfig.from_run_config(run_config), num_nodes)
    return ClientCost(
        method,
        rounds,
        dict(timed_app.seconds),
        dict(timed_app.calls),
        timed_app.trainings,
    )


def rows(costs: Sequence[ClientCost]) -> list[dict[str, Any]]:
    """Per method: seconds, calls and the two ratios to FedAvg."""
    baseline = next(cost for cost in costs if cost.method == BASELINE)
    return [
        {
            "method": cost.method,
            "seconds_per_round": cost.per_round,
            "seconds_per_train": cost.per_train,
            "ratio_per_round": cost.per_round / baseline.per_round,
            "ratio_per_train": cost.per_train / baseline.per_train,
            "seconds_by_type": dict(cost.seconds),
            "calls_by_type": dict(cost.calls),
            "rounds": cost.rounds,
            "trainings_per_round": cost.trainings / cost.rounds,
            "ratio_trainings": cost.trainings / max(baseline.trainings, 1),
        }
        for cost in costs
    ]


def scale_table(table: Sequence[Mapping[str, Any]]) -> str:
    """Trainings and client seconds per round at scale, against FedAvg's."""
    columns = [
        "method",
        "client trainings/round",
        "vs FedAvg",
        "client s/round (all nodes)",
        "vs FedAvg",
    ]
    cells = [
        [
            row["method"],
            f"{row['trainings_per_round']:.0f}",
            f"{row['ratio_trainings']:.1f}",
            f"{row['seconds_per_round']:.2f}",
            f"{row['ratio_per_round']:.1f}",
        ]
        for row in table
    ]
    return markdown_table(columns, cells)


def overhead_table(table: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a markdown table."""
    columns = [
        "method",
        "client s/round (all nodes)",
        "vs FedAvg",
        "s per train message",
        "vs FedAvg",
        "messages per round",
    ]
    cells = []
    for row in table:
        messages = ", ".join(
            f"{kind} {calls / row['rounds']:.1f}"
            for kind, calls in sorted(row["calls_by_type"].items())
        )
        cells.append(
            [
                row["method"],
                f"{row['seconds_per_round']:.3f}",
                f"{row['ratio_per_round']:.2f}",
                f"{row['seconds_per_train'] * 1e3:.1f} ms",
                f"{row['ratio_per_train']:.2f}",
                messages,
            ]
        )
    return markdown_table(columns, cells)


def plot(table: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Both ratios to FedAvg as grouped bars."""
    figure, axes = plt.subplots(figsize=(8, 4))
    positions = range(len(table))
    axes.bar(
        [p - 0.2 for p in positions],
        [row["ratio_per_round"] for row in table],
        0.4,
        label="per round (all nodes)",
    )
    axes.bar(
        [p + 0.2 for p in positions],
        [row["ratio_per_train"] for row in table],
        0.4,
        label="per train message",
    )
    axes.axhline(1.0, color="grey", linestyle=":")
    axes.set_xticks(list(positions), [row["method"] for row in table], rotation=30)
    axes.set(ylabel="client time / FedAvg's", title="Client overhead per round")
    axes.legend()
    save_figure(figure, path, dpi=110)


def main(argv: Sequence[str] | None = None) -> None:
    """Measure every method's client time; write the table, JSON and plot."""
    args = benchmark_parser("client_overhead", __doc__).parse_args(argv)
    prepare_run()
    num_nodes, rounds = (50, 10) if args.full else (20, 5)
    scale_rounds = 3 if args.full else 2
    args.output_dir.mkdir(parents=True, exist_ok=True)
    costs = [
        measure(method, num_nodes, rounds, 0, args.output_dir) for method in METHODS
    ]
    table = rows(costs)
    at_scale = rows(
        [
            measure(method, SCALE_NODES, scale_rounds, 0, args.output_dir, SCALE_DATA)
            for method in (*METHODS, *POOLED)
        ]
    )
    plot(table, args.output_dir / "client_overhead.png")
    results = {
        "mode": "full" if args.full else "quick",
        "num_nodes": num_nodes,
        "rounds": rounds,
        "settings": {**COMMON},
        "rows": table,
        "scale": {
            "num_nodes": SCALE_NODES,
            "rounds": scale_rounds,
            "data": SCALE_DATA,
            "rows": at_scale,
        },
    }
    (args.output_dir / "results.json").write_text(json.dumps(results, indent=1))
    text = (
        "# Client overhead per round\n\n"
        f"{num_nodes} nodes, {rounds} rounds, {CLIENTS_PER_ROUND} clients per round, "
        f"{LOCAL_STEPS} local steps of {BATCH_SIZE} samples, MLP on digits; time "
        "inside the ClientApp only (size queries of the first round included in "
        "the mean). Times vary between runs and machines.\n\n"
        f"{overhead_table(table)}\n\n![client overhead](client_overhead.png)\n\n"
        f"At {SCALE_NODES:,} nodes ({scale_rounds} rounds, in process; "
        "FedProx's Synthetic(1, 1), 40 samples per node; OCS and AOCS also "
        f"with an available pool of {POOL_FACTOR}m nodes): local training runs "
        "and client seconds per round.\n\n"
        f"{scale_table(at_scale)}\n"
    )
    (args.output_dir / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
