"""FOLB against FedProx and FedAvg on identical device sets (Nguyen et al., Table I).

Runs the simulation app's real strategies and ClientApp on the in-process grid
and compares them through :mod:`benchmarks.evidence`. Within a seed every
method gets the same data, initial model, device sets per round (FOLB draws
``K`` distinct devices with the same seeded function as the ``fedavg`` and
``fedprox`` baselines) and local epochs per device and round; the run checks
this from the messages it sees and fails otherwise. The aggregation (and
``mu``) is the only difference:

- FOLB, eq. 13 on the sample-weighted objective, at its preset's ``mu``;
- FedProx at its preset's ``mu`` (the paper's baseline);
- FedAvg;
- "FedProx, FOLB's mu": FedProx's plain sample-weighted mean at FOLB's ``mu``,
  which isolates FOLB's weights from its smaller ``mu``.

Columns: *matched* (every method at the paper's local learning rate: FOLB's
weights sum to 1 in absolute value, so its step has FedProx's scale), the
plain-mean control at FOLB's ``mu``, and *tuned* (each method picks its local
learning rate from one grid on tuning seeds). Claims: rounds to a target test
accuracy (Table I) and the final global training loss
``f = sum_k (n_k / n) F_k``.

    python -m benchmarks.folb            # quick: Synthetic(1,1), 5-15 seeds, ~5 min
    python -m benchmarks.folb --full     # 10 seeds, 200/100 rounds, E = 20, 3 data sets

Quick mode runs 20 rounds with local epochs drawn in 1..2 (the presets' E = 20
costs ten times more per round) and tunes FOLB and FedProx only; ``--full``
runs the presets as they are and tunes every method.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")
import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord

from benchmarks.evidence import (
    Comparison,
    Evaluation,
    Overrides,
    PaperComparison,
    RunFunction,
    SeedRun,
    TargetRule,
    run_comparisons,
    write_outputs,
)
from benchmarks.harness import benchmark_parser, start_benchmark
from flwr_importance.protocol import FOLB_FALLBACK
from flwr_importance.tasks import Objective, evaluate
from flwr_importance.tooling.testing import InProcessGrid
from simulations.client_app import app as client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import load_preset, resolve_run_config
from simulations.methods import load_method
from simulations.task import federated_data, global_model

#: The section title of this benchmark in docs/results.md.
TITLE = "FOLB vs FedProx and FedAvg (Nguyen et al., JSAC 2021, Table I)"

NUM_CLIENTS = 30
PAPER = "Nguyen et al., IEEE JSAC 2021, Fast-convergent federated learning"
FOLB, FEDPROX, FEDAVG = "FOLB", "FedProx", "FedAvg"
PLAIN_MEAN = "FedProx, FOLB's mu"
TUNING_SEEDS = (100, 101)
#: The tuned columns' grid of local learning rates (the paper's 0.01 and 0.03).
LEARNING_RATES = (0.01, 0.03, 0.1)
DATA = {
    "synthetic-1-1": "FedProx's Synthetic(1,1), 30 devices with power-law sizes "
    "(log-normal, 50 to thousands of samples), multinomial logistic regression: "
    "the paper's own data, where Table I has its largest gap",
    "synthetic-iid": "FedProx's Synthetic_iid, 30 devices, multinomial logistic "
    "regression: the paper's own data",
    "digits": "8x8 digits, 30 devices of 2 digits each, an MLP: an offline stand-in "
    "for the paper's MNIST (1,000 devices)",
}
#: Rounds to target in the paper's Table I: (FOLB, FedProx, FedAvg).
PAPER_ROUNDS = {
    "synthetic-1-1": (19, 154, 177),
    "synthetic-iid": (50, 57, 113),
    "digits": (11, 25, 25),
}


@dataclass(frozen=True)
class Scale:
    """How much to run: data sets with their rounds, local epochs, seeds."""

    rounds: Mapping[str, int]
    #: ``E``: each device runs a uniform number of epochs in ``1..E`` a round;
    #: ``None`` keeps the preset's.
    local_epochs: int | None
    reported_seeds: tuple[int, ...]
    #: The methods of the tuned column (the claim's pair at least).
    tuned: tuple[str, ...] = (FOLB, FEDPROX, FEDAVG, PLAIN_MEAN)
    #: The most seeds a powered row rises to (quick: the main row, FOLB /
    #: FedProx at the same local lr; ``--full``: every row).
    powered_seeds: int = 0


#: Quick mode tunes only the claim's pair: each tuned method costs 6 more
#: runs. Its main row may add 10 seeds (20 runs of about 4 s).
QUICK = Scale(
    {"synthetic-1-1": 20}, 2, tuple(range(5)), tuned=(FOLB, FEDPROX), powered_seeds=15
)
FULL = Scale(
    {"synthetic-1-1": 200, "synthetic-iid": 200, "digits": 100},
    None,
    tuple(range(10)),
    powered_seeds=20,
)


@dataclass
class Run:
    """One run's per-round record; lists hold round 0 (the initial model) first."""

    accuracy: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    #: Per round 1..R: the partitions sent a train message, and each one's
    #: reported local SGD steps (epochs times its batches per epoch).
    schedule: list[dict[int, int]] = field(default_factory=list)
    fallback_rounds: int = 0
    seconds: float = 0.0

    def extras(self) -> dict[str, float]:
        """The table's extra columns."""
        return {
            "devices / round": float(np.mean([len(r) for r in self.schedule])),
            "FOLB fallback rounds": float(self.fallback_rounds),
        }


def run_once(overrides: Overrides) -> Run:
    """Run the app's strategy with ``overrides`` on ``NUM_CLIENTS`` nodes.

    Evaluates centrally after every round: test accuracy, and the global
    training loss ``f(w) = sum_k (n_k / n) F_k(w)`` (the pooled training data).
    """
    run_config = resolve_run_config(overrides)
    config = ExperimentConfig.from_run_config(run_config)
    data = federated_data(config, NUM_CLIENTS)
    model = global_model(config, data)
    objective = Objective(data.task, l2=config.l2)
    train_x = torch.cat([partition.x for partition in data.partitions])
    train_y = torch.cat([partition.y for partition in data.partitions])
    grid = InProcessGrid(client_app, NUM_CLIENTS, run_config, seed=config.seed)
    strategy = load_method(config.strategy).build_strategy(config, NUM_CLIENTS)
    run = Run()
    read = 0

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        nonlocal read
        model.load_state_dict(arrays.to_torch_state_dict())
        run.accuracy.append(
            evaluate(model, data.test.x, data.test.y, objective)["accuracy"]
        )
        run.train_loss.append(evaluate(model, train_x, train_y, objective)["loss"])
        if server_round > 0:
            run.schedule.append(_train_schedule(grid, read))
        read = len(grid.wire_log)
        return MetricRecord({"accuracy": run.accuracy[-1]})

    started = time.perf_counter()
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=config.num_server_rounds,
        evaluate_fn=central_evaluate,
    )
    run.seconds = time.perf_counter() - started
    run.fallback_rounds = sum(
        _number(record, FOLB_FALLBACK) > 0
        for record in result.train_metrics_clientapp.values()
    )
    return run


def _train_schedule(grid: InProcessGrid, start: int) -> dict[int, int]:
    """Partition -> reported local steps, for the train replies since ``start``."""
    steps = {}
    for record in grid.wire_log[start:]:
        if record.direction == "to-server" and record.message_type == "train":
            metrics = next(iter(record.message().content.metric_records.values()))
            steps[grid.partition_of(record.node_id)] = int(
                _number(metrics, "num-steps")
            )
    return steps


def _number(metrics: MetricRecord, key: str) -> float:
    """A scalar metric (0 if absent)."""
    value = metrics.get(key, 0)
    if isinstance(value, list):
        raise ValueError(f"metric {key!r} is a list, expected a number")
    return float(value)


class Runs:
    """Every run of the benchmark, once each, and the checks across methods.

    Two claims read the same runs (rounds to target accuracy, final training
    loss): :meth:`function` gives each one a run function over one cache.
    """

    def __init__(self, dataset: str, scale: Scale) -> None:
        self.dataset = dataset
        self.base: dict[str, bool | int | float | str] = {
            **load_preset(f"folb-{dataset}"),
            "num-server-rounds": scale.rounds[dataset],
        }
        if scale.local_epochs is not None:
            self.base.update({"local-steps": 0, "local-epochs": scale.local_epochs})
        self.done: dict[tuple[tuple[tuple[str, Any], ...], int], Run] = {}

    def get(self, overrides: Overrides, seed: int) -> Run:
        """The run of ``overrides`` on ``seed`` (run now if not yet)."""
        key = (tuple(sorted(overrides.items())), seed)
        if key not in self.done:
            run = run_once({**self.base, **overrides, "seed": seed})
            print(
                f"  {self.dataset} {dict(overrides)} seed {seed}: accuracy "
                f"{run.accuracy[-1]:.3f}, loss {run.train_loss[-1]:.3f} "
                f"({run.seconds:.1f} s)",
                flush=True,
            )
            self.done[key] = run
        return self.done[key]

    def function(self, metric: str) -> RunFunction:
        """``(overrides, seed) -> SeedRun`` of ``metric`` (``accuracy``/``loss``)."""

        def run(overrides: Overrides, seed: int) -> SeedRun:
            record = self.get(overrides, seed)
            curve = record.accuracy if metric == "accuracy" else record.train_loss
            return SeedRun(curve=list(curve), extras=record.extras())

        return run

    def check_common_random_numbers(self) -> int:
        """Raise unless every run of a seed trained the same devices and epochs.

        Compares, round by round, which partitions got a train message and the
        local steps each reported, over every run of the seed (methods and
        learning rates). Returns the number of seeds checked.
        """
        by_seed: dict[int, list[dict[int, int]]] = {}
        for (_, seed), run in self.done.items():
            first = by_seed.setdefault(seed, run.schedule)
            if run.schedule != first:
                raise AssertionError(
                    f"{self.dataset}, seed {seed}: two methods trained different "
                    "devices or local work; the comparison would not be fair"
                )
        return len(by_seed)


def methods(dataset: str) -> dict[str, Overrides]:
    """The compared methods, each with its preset's ``mu``."""
    folb_mu = float(load_preset(f"folb-{dataset}")["proximal-mu"])
    fedprox_mu = float(load_preset(f"folb-{dataset}-fedprox")["proximal-mu"])
    return {
        FOLB: {"strategy": "folb", "proximal-mu": folb_mu},
        FEDPROX: {"strategy": "fedprox", "proximal-mu": fedprox_mu},
        FEDAVG: {"strategy": "fedavg", "proximal-mu": 0.0},
        PLAIN_MEAN: {"strategy": "fedprox", "proximal-mu": folb_mu},
    }


def comparisons(dataset: str, scale: Scale) -> tuple[Comparison, ...]:
    """Matched, plain mean at FOLB's mu, tuned."""
    compared = methods(dataset)
    paper_lr = float(load_preset(f"folb-{dataset}")["local-lr"])
    return (
        Comparison(
            name="matched (same local lr)",
            methods=compared,
            baseline=FEDPROX,
            claimed=(FOLB,),
            # The rate is explicit so the tuned runs at it are the same runs.
            shared={"local-lr": paper_lr},
            note=f"Every method at the paper's local lr {paper_lr:g}; FOLB's "
            "weights sum to 1 in absolute value (server lr 1), so its step has "
            "FedProx's scale.",
        ),
        Comparison(
            name="weights only (plain mean at FOLB's mu)",
            methods={FOLB: compared[FOLB], PLAIN_MEAN: compared[PLAIN_MEAN]},
            baseline=PLAIN_MEAN,
            claimed=(FOLB,),
            shared={"local-lr": paper_lr},
            note="Same mu, same lr, same devices and local work: FOLB's weights "
            "against FedProx's sample-weighted mean are the only difference.",
        ),
        Comparison(
            name="tuned",
            methods={name: compared[name] for name in scale.tuned},
            baseline=FEDPROX,
            claimed=(FOLB,),
            tuned=True,
        ),
    )


def descriptions(dataset: str, scale: Scale) -> tuple[PaperComparison, ...]:
    """Table I's claim (rounds to target accuracy) and the training-loss claim."""
    folb, fedprox, fedavg = PAPER_ROUNDS[dataset]
    common: dict[str, Any] = {
        "paper": PAPER,
        "direction": "below",
        "tuning_seeds": TUNING_SEEDS,
        "reported_seeds": scale.reported_seeds,
        "learning_rates": LEARNING_RATES,
        "data": DATA[dataset],
        "comparisons": comparisons(dataset, scale),
        # Table I's comparison: FOLB against FedProx at the paper's step.
        "main_row": ("matched (same local lr)", FOLB),
        "powered_seeds": scale.powered_seeds,
    }
    return (
        PaperComparison(
            title=f"{dataset}: rounds to a target test accuracy",
            claim="FOLB reaches a target accuracy in fewer rounds than FedProx "
            f"(Table I: {folb} vs {fedprox}, FedAvg {fedavg})",
            metric="test accuracy",
            higher_is_better=True,
            target=TargetRule(fraction=0.9),
            **common,
        ),
        PaperComparison(
            title=f"{dataset}: final global training loss",
            claim="FOLB ends at a lower training loss than FedProx",
            metric="training loss",
            higher_is_better=False,
            target=TargetRule(fraction=0.9),
            statistic="final",
            **common,
        ),
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run the comparisons; write ``summary.md``, ``results.json``, claims, plots."""
    args, out = start_benchmark(benchmark_parser("folb", __doc__), argv)
    scale = FULL if args.full else QUICK
    started = time.perf_counter()
    evaluations: list[Evaluation] = []
    checked = []
    for dataset in scale.rounds:
        runs = Runs(dataset, scale)
        for description, metric in zip(
            descriptions(dataset, scale), ("accuracy", "loss"), strict=True
        ):
            evaluation = run_comparisons(
                description, runs.function(metric), full=args.full
            )
            evaluation.plot(out / f"{dataset}-{metric}.png")
            evaluations.append(evaluation)
        checked.append(f"{dataset}: {runs.check_common_random_numbers()} seeds")
    epochs = (
        f"drawn in 1..{scale.local_epochs}"
        if scale.local_epochs is not None
        else "drawn in 1..E as the presets say"
    )
    header = [
        "# FOLB vs FedProx vs FedAvg",
        f"{NUM_CLIENTS} devices, K = 10 distinct devices per round, the same for "
        "every method within a seed (checked from the train messages: "
        f"{', '.join(checked)}), local epochs {epochs} per device and round "
        "(the same for every method), batch 10. FOLB: eq. 13 on the "
        "sample-weighted objective, server lr 1. Open: the paper's server step "
        "scale was lost in its text; no method's server step is tuned here.",
    ]
    summary = "\n\n".join(
        [*header, *(evaluation.markdown(level=2).strip() for evaluation in evaluations)]
    )
    write_outputs(out, summary, evaluations)
    # The time is printed, not written: summary.md must not vary between runs.
    print(f"Total time {time.perf_counter() - started:.0f} s.")


if __name__ == "__main__":
    main()
