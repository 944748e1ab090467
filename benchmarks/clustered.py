"""Clustered sampling (Algorithms 1 and 2) against MD sampling, through the real app.

Drives the simulation app's strategies and ClientApp on the in-process grid
(protobuf round trips, one ``Context`` per node) and compares each method with
MD sampling through :mod:`benchmarks.evidence`: every method runs the same
seeds (same data, same initial model, same local work), the target accuracy is
90% of MD's final median on the tuning seeds, and each ratio of median rounds
to target carries a paired bootstrap 95% interval and a computed verdict.
Per method it also reports, as medians over the seeds, the distinct clients
and classes aggregated per round, the final training loss and the variance of
the test accuracy over the second half of the rounds (the paper's "smoother
convergence").

Settings: digits with one class per client (100 clients, 10 per digit,
``m = 10``, the paper's MNIST experiment, Figure 1) and, if not skipped, the
Dirichlet(alpha) size-unbalanced split for alpha in {0.001, 0.01, 0.1, 10}
(the paper's CIFAR-10 experiment, Figure 2). Also measures the server state
of Algorithm 2 for 1,000 clients of a 1M-parameter model.

Usage: ``python -m benchmarks.clustered [--full] [--skip-dirichlet]
[--output-dir DIR]``.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord

from benchmarks.evidence import (
    Comparison,
    Overrides,
    PaperComparison,
    RunFunction,
    SeedRun,
    TargetRule,
    run_comparisons,
    write_outputs,
)
from benchmarks.harness import benchmark_parser, markdown_table, start_benchmark
from benchmarks.variance_reduced import FEDADAM, FEDADAM_ETAS, fedadam_note
from flwr_importance.sampling.representatives import RepresentativeGradients
from flwr_importance.strategies._multiset import MultisetSampling
from flwr_importance.tasks import Objective, evaluate
from flwr_importance.tooling.testing import InProcessGrid
from simulations.client_app import app as client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import load_preset, resolve_run_config
from simulations.methods import load_method
from simulations.task import federated_data, global_model

#: The section title of this benchmark in docs/results.md.
TITLE = "Clustered sampling vs MD sampling (Fraboni et al., ICML 2021)"

NUM_CLIENTS = 100
#: Clients drawn per round and classes of the task, in every setting.
DRAWS, NUM_CLASSES = 10, 10
BASELINE = "md"
#: Method name -> run-config overrides.
METHODS: dict[str, Overrides] = {
    "md": {"strategy": "md"},
    "alg1-size": {"strategy": "clustered", "clustered-method": "size"},
    "alg2-arccos": {"strategy": "clustered", "clustered-distance": "arccos"},
    "alg2-l2": {"strategy": "clustered", "clustered-distance": "l2"},
    "alg2-l1": {"strategy": "clustered", "clustered-distance": "l1"},
}
#: The methods the paper's claim is about: Algorithm 1 and Algorithm 2 as it runs it.
CLAIMED = ("alg1-size", "alg2-arccos")
ALPHAS = (0.001, 0.01, 0.1, 10.0)
#: Each claim's main row: Algorithm 2 (the paper's similarity-based sampling,
#: its contribution for non-IID clients) against MD, and in the sweep at
#: alpha 0.01, the middle of the non-IID alphas.
MAIN_METHOD, MAIN_ALPHA = "alg2-arccos", 0.01
#: The most seeds the main row rises to in quick mode (a run takes about 2 s).
POWERED_SEEDS = 15
PAPER = (
    "Fraboni et al., ICML 2021, Clustered sampling: low-variance and improved "
    "representativity for clients selection in federated learning"
)
TUNING_SEEDS = (100, 101)


@dataclass
class Run:
    """One run's per-round record.

    ``accuracy`` and the other lists hold server rounds 1..R; the initial
    model's test accuracy (round 0) is ``initial_accuracy``.
    """

    initial_accuracy: float = float("nan")
    accuracy: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    distinct_clients: list[int] = field(default_factory=list)
    distinct_classes: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def seed_run(self) -> SeedRun:
        """The test accuracy per round (round 0 first) and the table's extras.

        The extras are this run's means over the rounds (over the second half
        where named so); the accuracy variance over the second half measures
        how smoothly it converges.
        """
        half = len(self.accuracy) // 2
        return SeedRun(
            curve=[self.initial_accuracy, *self.accuracy],
            extras={
                "distinct clients / round": float(np.mean(self.distinct_clients)),
                f"rounds with {DRAWS} distinct": float(
                    np.mean(np.equal(self.distinct_clients, DRAWS))
                ),
                "distinct classes / round": float(np.mean(self.distinct_classes)),
                "same, 2nd half": float(np.mean(self.distinct_classes[half:])),
                f"rounds with all {NUM_CLASSES} classes": float(
                    np.mean(np.equal(self.distinct_classes, NUM_CLASSES))
                ),
                "train loss (final)": self.train_loss[-1],
                "var(acc), 2nd half": float(np.var(self.accuracy[half:])),
            },
        )


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
        if server_round == 0:
            run.initial_accuracy = test["accuracy"]
        else:
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


def run_function(rounds: int, output_dir: Path) -> RunFunction:
    """``(overrides, seed) -> SeedRun`` of :func:`run_once` for ``rounds`` rounds."""

    def run(overrides: Overrides, seed: int) -> SeedRun:
        record = run_once(
            {
                **overrides,
                "seed": seed,
                "num-server-rounds": rounds,
                "output-dir": str(output_dir / "runs"),
            }
        )
        print(
            f"  {overrides['strategy']} seed {seed}: final accuracy "
            f"{record.accuracy[-1]:.3f} ({record.seconds:.1f} s)",
            flush=True,
        )
        return record.seed_run()

    return run


def descriptions(full: bool) -> tuple[PaperComparison, PaperComparison]:
    """The one-class comparison (Figure 1) and the alpha sweep (Figure 2)."""
    reported = tuple(range(10 if full else 5))
    common: dict[str, Any] = {
        "paper": PAPER,
        "direction": "below",
        "metric": "test accuracy",
        "higher_is_better": True,
        "target": TargetRule(fraction=0.9),
        "tuning_seeds": TUNING_SEEDS,
        "reported_seeds": reported,
        "powered_seeds": 20 if full else POWERED_SEEDS,
    }
    one_class = PaperComparison(
        title="Digits, one class per client (100 clients, m = 10)",
        claim="clustered sampling (Algorithms 1 and 2) reaches a target accuracy "
        "in fewer rounds than MD sampling when each client holds one class",
        data="digits (1,437 images, 8x8), 100 clients of one digit each (14 or 15 "
        "samples), logistic regression: the paper's one-class MNIST split at the "
        "size of the offline data",
        comparisons=(
            Comparison(
                name="one class per client, same step",
                methods=METHODS,
                baseline=BASELINE,
                claimed=CLAIMED,
                shared=load_preset("clustered-digits"),
                note="Clustered and MD sampling aggregate the same plain mean "
                "with the same local step: only the draws differ.",
            ),
            Comparison(
                name="one class per client, FedAdam server step",
                methods={m: METHODS[m] for m in (BASELINE, MAIN_METHOD)},
                baseline=BASELINE,
                claimed=(MAIN_METHOD,),
                shared={**load_preset("clustered-digits"), **FEDADAM},
                tuned=full,
                note=fedadam_note(full),
            ),
        ),
        main_row=("one class per client, same step", MAIN_METHOD),
        # Only the FedAdam row is tuned (--full): the server step's eta.
        learning_rates=FEDADAM_ETAS,
        learning_rate_key="server-optimizer-eta",
        **common,
    )
    sweep_methods = METHODS if full else {m: METHODS[m] for m in (BASELINE, *CLAIMED)}
    largest = max(ALPHAS)
    dirichlet = PaperComparison(
        title="Dirichlet(alpha) size-unbalanced digits",
        claim="clustered sampling reaches a target accuracy in fewer rounds than "
        f"MD sampling at alpha < {largest:g} (at alpha = {largest:g} they match)",
        data="digits split over 100 clients by Dirichlet(alpha) labels and the "
        "paper's unbalanced sizes, logistic regression: the paper's CIFAR-10 "
        "sweep at the size of the offline data",
        comparisons=tuple(
            Comparison(
                name=f"alpha {alpha:g}",
                methods=sweep_methods,
                baseline=BASELINE,
                # The paper has them match at the largest alpha: no claim there.
                claimed=CLAIMED if alpha < largest else (),
                shared=load_preset(f"clustered-dirichlet-{alpha:g}"),
            )
            for alpha in ALPHAS
        ),
        main_row=(f"alpha {MAIN_ALPHA:g}", MAIN_METHOD),
        **common,
    )
    return one_class, dirichlet


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


def main(argv: Sequence[str] | None = None) -> None:
    """Run the comparisons; write the summary, results, claims and plots."""
    parser = benchmark_parser("clustered", __doc__)
    parser.add_argument("--skip-dirichlet", action="store_true")
    args, out = start_benchmark(parser, argv)
    rounds = 100 if args.full else 30
    run = run_function(rounds, out)
    one_class, dirichlet = descriptions(args.full)
    evaluations = [run_comparisons(one_class, run, full=args.full)]
    if not args.skip_dirichlet:
        evaluations.append(run_comparisons(dirichlet, run, full=args.full))
    for evaluation, name in zip(evaluations, ("one-class", "dirichlet"), strict=False):
        evaluation.plot(out / f"{name}.png")

    print("Memory: 1,000 clients, 1M-parameter model")
    memory = memory_check(projection_dim=1024 if args.full else 256)
    md_all_distinct = np.prod(1 - np.arange(DRAWS) / NUM_CLIENTS)
    sections = [
        f"# Clustered sampling vs MD sampling ({rounds} rounds)",
        evaluations[0].markdown(level=2),
        "Paper (MNIST, Figure 1): clustered sampling aggregates 10 distinct "
        "clients every round, MD only in "
        f"{md_all_distinct:.0%} of rounds (100!/(90! 100^10)); Algorithm 2 "
        "quickly covers every class; both converge smoother and faster than MD.",
        "About our setting: the digits partitions hold 14 or 15 samples, so "
        "Algorithm 1 lets a few clients straddle two distributions (rare "
        "repeats); it does not know the classes, so class coverage is "
        "whatever the node order gives. Algorithm 2 needs updates from most "
        "clients before its clusters match the classes (never-sampled clients "
        "share a zero gradient), so its class coverage grows over the rounds "
        "(the second-half column). Digits with a logistic regression is far "
        "smaller than MNIST with a CNN, so accuracy gaps are noisier.",
        *([evaluations[1].markdown(level=2)] if len(evaluations) > 1 else []),
        "## Algorithm 2 server state, 1,000 clients, 1M-parameter model",
        memory_table(memory),
    ]
    results = {
        "evaluations": [evaluation.to_json() for evaluation in evaluations],
        "memory": memory,
        "rounds": rounds,
    }
    summary = "\n\n".join(part.strip() for part in sections)
    write_outputs(out, summary, evaluations, results)


if __name__ == "__main__":
    main()
