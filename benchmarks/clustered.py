"""Clustered sampling (Algorithms 1 and 2) against MD sampling, through the real app.

Drives the simulation app's strategies and ClientApp on the in-process grid
(protobuf round trips, one ``Context`` per node) for several seeds and reports,
per method:

- the mean number of distinct clients and of distinct classes aggregated per
  round, and the fraction of rounds with ``m`` distinct clients / all classes;
- the global training loss (sample-weighted over every client's data) and the
  test accuracy after the last round;
- the variance of the test accuracy across the rounds of the second half of
  training (the paper's "smoother convergence").

Settings: digits with one class per client (100 clients, 10 per digit,
``m = 10``, the paper's MNIST experiment, Figure 1) and, if not skipped, the
Dirichlet(alpha) size-unbalanced split for alpha in {0.001, 0.01, 0.1, 10}
(the paper's CIFAR-10 experiment, Figure 2).  Also measures the server state
of Algorithm 2 for 1,000 clients of a 1M-parameter model.

Usage: ``python -m benchmarks.clustered [--full] [--skip-dirichlet]
[--output-dir DIR]``.
"""

from __future__ import annotations

import json
import statistics
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord

from benchmarks.harness import (
    benchmark_parser,
    markdown_table,
    prepare_run,
    save_figure,
)
from flwr_importance.strategies._multiset import MultisetSampling
from flwr_importance.strategies.clustered import RepresentativeGradients
from flwr_importance.tasks import Objective, evaluate
from flwr_importance.testing import InProcessGrid
from simulations.client_app import app as client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import load_preset, resolve_run_config
from simulations.methods import load_method
from simulations.task import federated_data, global_model

NUM_CLIENTS = 100
BASELINE = "md"
#: Method name -> run-config overrides.
METHODS: dict[str, dict[str, bool | int | float | str]] = {
    "md": {"strategy": "md"},
    "alg1-size": {"strategy": "clustered", "clustered-method": "size"},
    "alg2-arccos": {"strategy": "clustered", "clustered-distance": "arccos"},
    "alg2-l2": {"strategy": "clustered", "clustered-distance": "l2"},
    "alg2-l1": {"strategy": "clustered", "clustered-distance": "l1"},
}
ALPHAS = (0.001, 0.01, 0.1, 10.0)


@dataclass
class Run:
    """One run's per-round record."""

    accuracy: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    distinct_clients: list[int] = field(default_factory=list)
    distinct_classes: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self, draws: int, num_classes: int) -> dict[str, float]:
        """The numbers the tables report."""
        late = self.accuracy[len(self.accuracy) // 2 :]
        return {
            "distinct-clients": float(np.mean(self.distinct_clients)),
            "rounds-all-distinct": float(
                np.mean(np.equal(self.distinct_clients, draws))
            ),
            "distinct-classes": float(np.mean(self.distinct_classes)),
            "late-distinct-classes": float(
                np.mean(self.distinct_classes[len(self.distinct_classes) // 2 :])
            ),
            "rounds-all-classes": float(
                np.mean(np.equal(self.distinct_classes, num_classes))
            ),
            "final-train-loss": self.train_loss[-1],
            "final-accuracy": self.accuracy[-1],
            "late-accuracy-variance": float(np.var(late)),
            "seconds": self.seconds,
        }


def run_once(overrides: dict[str, Any]) -> Run:
    """Run the app's strategy with ``overrides``; record every round."""
    run_config = resolve_run_config(overrides)
    config = ExperimentConfig.from_run_config(run_config)
    data = federated_data(config, NUM_CLIENTS)
    model = global_model(config, data)
    objective = Objective(data.task, l2=config.l2)
    strategy = load_method(config.strategy).build_strategy(config, NUM_CLIENTS)
    assert isinstance(strategy, MultisetSampling)
    grid = InProcessGrid(client_app, NUM_CLIENTS, run_config, seed=config.seed)
    classes = [set(part.y.tolist()) for part in data.partitions]
    train_x = torch.cat([part.x for part in data.partitions])
    train_y = torch.cat([part.y for part in data.partitions])
    run = Run()

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        test = evaluate(model, data.test.x, data.test.y, objective)
        train = evaluate(model, train_x, train_y, objective)
        if server_round > 0:
            drawn = strategy.drawn_counts
            covered = set().union(*(classes[grid.partition_of(n)] for n in drawn))
            run.distinct_clients.append(len(drawn))
            run.distinct_classes.append(len(covered))
            run.accuracy.append(test["accuracy"])
            run.train_loss.append(train["loss"])
        return MetricRecord(dict(test))

    started = time.perf_counter()
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=config.num_server_rounds,
        evaluate_fn=central_evaluate,
    )
    run.seconds = time.perf_counter() - started
    return run


def ratio(values: Sequence[float], baseline: Sequence[float]) -> float:
    """Mean of ``values`` over mean of ``baseline`` (over seeds)."""
    return float(np.mean(values)) / max(float(np.mean(baseline)), 1e-12)


def mean_std(values: Sequence[float]) -> str:
    """``mean ± std`` over seeds."""
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {spread:.3f}"


def compare(
    preset: str,
    methods: Sequence[str],
    seeds: Sequence[int],
    rounds: int,
    extra: dict[str, Any] | None = None,
) -> dict[str, list[Run]]:
    """Every method on ``preset`` for every seed (same seed, same data)."""
    runs: dict[str, list[Run]] = {}
    for method in methods:
        runs[method] = []
        for seed in seeds:
            overrides = {
                **load_preset(preset),
                **(extra or {}),
                **METHODS[method],
                "seed": seed,
                "num-server-rounds": rounds,
            }
            runs[method].append(run_once(overrides))
            print(f"  {preset} {method} seed {seed}: {runs[method][-1].seconds:.1f} s")
    return runs


def summarize(runs: dict[str, list[Run]]) -> dict[str, dict[str, list[float]]]:
    """Per method, each summary number over the seeds."""
    table: dict[str, dict[str, list[float]]] = {}
    for method, method_runs in runs.items():
        summaries = [run.summary(draws=10, num_classes=10) for run in method_runs]
        table[method] = {key: [s[key] for s in summaries] for key in summaries[0]}
    return table


def one_class_table(table: dict[str, dict[str, list[float]]], seeds: int) -> str:
    """Markdown table of the one-class setting with ratios against MD."""
    base = table[BASELINE]
    columns = [
        "method",
        "distinct clients / round",
        "rounds with 10 distinct",
        "distinct classes / round",
        "same, 2nd half",
        "rounds with all 10 classes",
        "train loss (final)",
        "test accuracy (final)",
        "acc. / MD",
        "var(acc), 2nd half",
        "var / MD",
    ]
    cells = []
    for method, numbers in table.items():
        accuracy_ratio = ratio(numbers["final-accuracy"], base["final-accuracy"])
        variance_ratio = ratio(
            numbers["late-accuracy-variance"], base["late-accuracy-variance"]
        )
        cells.append(
            [
                method,
                mean_std(numbers["distinct-clients"]),
                mean_std(numbers["rounds-all-distinct"]),
                mean_std(numbers["distinct-classes"]),
                mean_std(numbers["late-distinct-classes"]),
                mean_std(numbers["rounds-all-classes"]),
                mean_std(numbers["final-train-loss"]),
                mean_std(numbers["final-accuracy"]),
                f"{accuracy_ratio:.2f}",
                mean_std(numbers["late-accuracy-variance"]),
                f"{variance_ratio:.2f}",
            ]
        )
    return (
        f"Mean ± std over {seeds} seeds; ratios are against MD in the same run.\n\n"
        + markdown_table(columns, cells)
    )


def dirichlet_table(sweep: dict[float, dict[str, dict[str, list[float]]]]) -> str:
    """Markdown table of the alpha sweep: gains of each method over MD."""
    columns = [
        "alpha",
        "method",
        "distinct classes / round",
        "train loss (final)",
        "test accuracy (final)",
        "acc. - MD",
        "var(acc), 2nd half",
        "var / MD",
    ]
    cells = []
    for alpha, table in sweep.items():
        base = table[BASELINE]
        for method, numbers in table.items():
            gain = np.mean(numbers["final-accuracy"]) - np.mean(base["final-accuracy"])
            variance_ratio = ratio(
                numbers["late-accuracy-variance"], base["late-accuracy-variance"]
            )
            cells.append(
                [
                    f"{alpha:g}",
                    method,
                    mean_std(numbers["distinct-classes"]),
                    mean_std(numbers["final-train-loss"]),
                    mean_std(numbers["final-accuracy"]),
                    f"{gain:+.3f}",
                    mean_std(numbers["late-accuracy-variance"]),
                    f"{variance_ratio:.2f}",
                ]
            )
    return markdown_table(columns, cells)


def memory_table(memory: dict[str, float]) -> str:
    """Markdown table of :func:`memory_check`'s numbers."""
    columns = [
        "projection dim",
        "state (MiB)",
        "without projection (MiB)",
        "extra peak in a round (MiB)",
    ]
    row = [
        memory["projection-dim"],
        f"{memory['state-mib']:.1f}",
        f"{memory['state-without-projection-mib']:.0f}",
        f"{memory['round-peak-extra-mib']:.1f}",
    ]
    return markdown_table(columns, [row])


def memory_check(
    nodes: int = 1000, parameters: int = 1_000_000, projection_dim: int = 1024
) -> dict[str, float]:
    """Algorithm 2's server state for ``nodes`` clients of a ``parameters`` model.

    One round: ``m = 10`` new updates, projected and stored, then the distance
    rows refreshed (the first refresh computes all of them).
    """
    state = RepresentativeGradients("arccos", projection_dim, seed=0)
    state.align(list(range(nodes)))
    rng = np.random.default_rng(0)
    updates = {node: rng.standard_normal(parameters) for node in range(10)}
    tracemalloc.start()
    started = time.perf_counter()
    state.update(updates)
    state.distances()
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "nodes": nodes,
        "parameters": parameters,
        "projection-dim": projection_dim,
        "state-mib": state.nbytes / 2**20,
        "state-without-projection-mib": (nodes * parameters * 4 + nodes**2 * 8) / 2**20,
        "round-peak-extra-mib": peak / 2**20,
        "round-seconds": seconds,
    }


def plot(
    runs: dict[str, list[Run]], sweep_runs: dict[float, dict[str, list[Run]]], out: Path
) -> list[Path]:
    """Accuracy and distinct classes per round (one-class), and the alpha sweep."""
    paths = []
    figure, (accuracy_axes, classes_axes) = plt.subplots(1, 2, figsize=(11, 4))
    for method, method_runs in runs.items():
        accuracy = np.mean([run.accuracy for run in method_runs], axis=0)
        classes = np.mean([run.distinct_classes for run in method_runs], axis=0)
        rounds = np.arange(1, accuracy.size + 1)
        accuracy_axes.plot(rounds, accuracy, label=method)
        classes_axes.plot(rounds, classes, label=method)
    accuracy_axes.set(xlabel="round", ylabel="test accuracy (mean over seeds)")
    classes_axes.set(xlabel="round", ylabel="distinct classes aggregated")
    accuracy_axes.legend()
    figure.suptitle("Digits, one class per client, 100 clients, m = 10")
    paths.append(out / "one-class.png")
    save_figure(figure, paths[-1])
    if sweep_runs:
        figure, axes = plt.subplots(
            1, len(sweep_runs), figsize=(4 * len(sweep_runs), 3.5)
        )
        for axis, (alpha, alpha_runs) in zip(
            np.atleast_1d(axes), sweep_runs.items(), strict=True
        ):
            for method, method_runs in alpha_runs.items():
                accuracy = np.mean([run.accuracy for run in method_runs], axis=0)
                axis.plot(np.arange(1, accuracy.size + 1), accuracy, label=method)
            axis.set(title=f"Dirichlet alpha = {alpha:g}", xlabel="round")
        np.atleast_1d(axes)[0].set_ylabel("test accuracy")
        np.atleast_1d(axes)[0].legend()
        paths.append(out / "dirichlet.png")
        save_figure(figure, paths[-1])
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    """Run the comparison; print and write the tables, JSON and plots."""
    parser = benchmark_parser("clustered", __doc__)
    parser.add_argument("--skip-dirichlet", action="store_true")
    args = parser.parse_args(argv)
    prepare_run()
    out: Path = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    run_dir = {"output-dir": str(out / "runs")}

    seeds = (0, 1, 2, 3, 4) if args.full else (0, 1, 2)
    rounds = 100 if args.full else 30
    print(f"One class per client: {len(seeds)} seeds, {rounds} rounds")
    one_class_runs = compare("clustered-digits", list(METHODS), seeds, rounds, run_dir)
    one_class = summarize(one_class_runs)

    sweep_runs: dict[float, dict[str, list[Run]]] = {}
    if not args.skip_dirichlet:
        sweep_methods = (
            list(METHODS) if args.full else ["md", "alg1-size", "alg2-arccos"]
        )
        sweep_seeds = seeds if args.full else (0,)
        print(f"Dirichlet sweep: {len(sweep_seeds)} seed(s), {rounds} rounds")
        for alpha in ALPHAS:
            sweep_runs[alpha] = compare(
                f"clustered-dirichlet-{alpha:g}",
                sweep_methods,
                sweep_seeds,
                rounds,
                run_dir,
            )
    sweep = {alpha: summarize(alpha_runs) for alpha, alpha_runs in sweep_runs.items()}

    print("Memory: 1,000 clients, 1M-parameter model")
    memory = memory_check(projection_dim=1024 if args.full else 256)

    md_all_distinct = np.prod(1 - np.arange(10) / NUM_CLIENTS)
    summary = "\n\n".join(
        [
            "# Clustered sampling vs MD sampling",
            f"## Digits, one class per client (100 clients, m = 10, {rounds} rounds)",
            one_class_table(one_class, len(seeds)),
            "Paper (MNIST, Figure 1): clustered sampling aggregates 10 distinct "
            "clients every round, MD only in "
            f"{md_all_distinct:.0%} of rounds (100!/(90! 100^10)); Algorithm 2 "
            "quickly covers every class; both converge smoother and faster than MD.",
            "Ours: the digits partitions hold 14 or 15 samples, so Algorithm 1 "
            "lets a few clients straddle two distributions (rare repeats); it does "
            "not know the classes, so class coverage is whatever the node order "
            "gives. Algorithm 2 needs updates from most clients before its "
            "clusters match the classes (never-sampled clients share a zero "
            "gradient), so its class coverage grows over the rounds (the "
            "second-half column) but rarely reaches all 10 within 30 rounds. "
            "Digits (8x8, ~14 samples per client, a logistic regression) is far "
            "smaller than MNIST with a CNN, so accuracy gaps are noisier. The "
            "Dirichlet sweep runs one seed in quick mode: read it as a trend.",
            *(
                [
                    "## Dirichlet(alpha) size-unbalanced digits "
                    f"({len(next(iter(sweep_runs.values()))[BASELINE])} seed(s))",
                    dirichlet_table(sweep),
                    "Paper (CIFAR-10, Figure 2): the smaller alpha, the larger the "
                    "gain of clustered sampling over MD; at alpha = 10 they match.",
                ]
                if sweep
                else []
            ),
            "## Algorithm 2 server state, 1,000 clients, 1M-parameter model",
            memory_table(memory),
        ]
    )
    (out / "summary.md").write_text(summary + "\n")
    (out / "results.json").write_text(
        json.dumps(
            {
                "one-class": one_class,
                "dirichlet": {str(alpha): table for alpha, table in sweep.items()},
                "memory": memory,
                "rounds": rounds,
                "seeds": list(seeds),
            },
            indent=1,
        )
    )
    plot(one_class_runs, sweep_runs, out)
    print(summary)


if __name__ == "__main__":
    main()
