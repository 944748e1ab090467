"""OCS and MMFL against uniform and random sampling, through the real app.

Runs the simulation app in process (``simulations.inprocess.run_inprocess``:
the real strategies and ClientApps, messages through the in-process grid) and
compares each method with its paper's baseline through
:mod:`benchmarks.evidence` (same seeds for every method, target fixed on
tuning seeds, ratios of median rounds to target with paired bootstrap 95%
intervals, computed verdicts):

- single model: OCS and AOCS against OCS's uniform control (``ocs-uniform``:
  ``p_i = m / N`` with OCS's norm query, unbiased estimator and seeded draws,
  so within a seed the two sample from the same uniforms, rule 1 of the
  evidence rules);
- multiple models: MMFL-gradnorm and MMFL-loss against random assignment and
  round-robin;
- ``--full`` only, the authors' cross-device setting: OCS and AOCS over an
  available pool of 32 of 1,000 clients, 3 sampled, against the uniform
  control over the same pools.

Per method it also reports the variance of the aggregated update against
uniform/random sampling (OCS and MMFL-gradnorm report, every round, the
estimator's variance given that round's updates under their probabilities and
under uniform/random ones, so the ratio is measured on the same updates) and
the client training runs per round.

Usage: ``python -m benchmarks.variance_reduced [--full] [--output-dir DIR]``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

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
from benchmarks.harness import benchmark_parser, start_benchmark
from simulations.inprocess import run_inprocess
from simulations.methods.mmfl import parse_tasks
from simulations.report import HistoryRow

#: The section title of this benchmark in docs/results.md.
TITLE = "OCS/AOCS vs uniform, MMFL vs random (Chen et al. 2022; Zhang et al. 2024)"

TUNING_SEEDS = (100, 101)
#: Overrides of both settings.
COMMON: dict[str, bool | int | float | str] = {
    "model": "logreg",
    "local-steps": 10,
    "batch-size": 16,
    "local-lr": 0.1,
}
#: Both sides of a FedAdam row take this server step: the app's
#: ``server-optimizer`` keys, Flower's FedAdam defaults (``eta`` 0.1, ``beta_1``
#: 0.9, ``beta_2`` 0.99) and the app's ``tau``.
FEDADAM: dict[str, bool | int | float | str] = {
    "server-optimizer": "adam",
    "server-optimizer-eta": 0.1,
    "server-optimizer-beta1": 0.9,
    "server-optimizer-beta2": 0.99,
    "server-optimizer-tau": 0.001,
}
#: The server learning rates a ``--full`` FedAdam row tunes each method over.
FEDADAM_ETAS = (0.01, 0.03, 0.1)
VARIANCE = "variance / uniform-or-random"
TRAININGS = "client trainings / round"


def trainings_per_round(row: HistoryRow, overrides: Overrides) -> float:
    """Local training runs this round: everyone on every model, or the sampled."""
    num_models = (
        len(parse_tasks(str(overrides["mmfl-tasks"])))
        if overrides.get("strategy") == "mmfl"
        else 1
    )
    pool = int(overrides.get("ocs-pool-size", 0))
    if overrides.get("strategy") == "ocs" and pool > 0:
        return float(pool)  # the available pool trains, the rest of the nodes not
    everyone_trains = overrides.get("strategy") == "ocs" or (
        overrides.get("mmfl-variant") == "gradnorm"
    )
    if everyone_trains:
        return float(int(overrides["num-supernodes"]) * num_models)
    return float(row.get("num-sampled", overrides["clients-per-round"]))


def run_function(output_dir: Path) -> RunFunction:
    """``(overrides, seed) -> SeedRun``: the mean test accuracy over the models."""

    def run(overrides: Overrides, seed: int) -> SeedRun:
        rows, _ = run_inprocess(
            {**overrides, "seed": seed, "output-dir": str(output_dir / "runs")}
        )
        ratios = [
            row["variance"] / row[baseline_key]
            for row in rows
            for baseline_key in ("uniform-variance", "random-variance")
            if "variance" in row and row.get(baseline_key, 0) > 0
        ]
        print(
            f"  {overrides['strategy']} {overrides.get('mmfl-variant', '')} seed "
            f"{seed}: final accuracy {rows[-1]['accuracy']:.3f}",
            flush=True,
        )
        return SeedRun(
            curve=[row["accuracy"] for row in rows],
            extras={
                VARIANCE: statistics.fmean(ratios) if ratios else float("nan"),
                TRAININGS: statistics.fmean(
                    trainings_per_round(row, overrides) for row in rows[1:]
                ),
            },
        )

    return run


def fedadam_note(full: bool) -> str:
    """What a FedAdam row matches: the server step, on both sides."""
    etas = ", ".join(f"{eta:g}" for eta in FEDADAM_ETAS)
    eta = FEDADAM["server-optimizer-eta"]
    step = (
        f"each side picks `server-optimizer-eta` from {etas} on the tuning seeds "
        "(each at its best)"
        if full
        else f"both sides at `server-optimizer-eta` {eta:g}, Flower's FedAdam "
        "default (a matched server step: tuning it would more than double this "
        "row's runs, beyond quick mode's budget; `--full` tunes it)"
    )
    return (
        "Both sides run the same FedAdam server step (the app's "
        "`server-optimizer = adam`, beta1 0.9, beta2 0.99, tau 0.001) on their "
        "round's update estimate, the one the first row aggregates, with the "
        f"same local step and seeded draws; {step}."
    )


#: The authors' cross-device setting (their public code's
#: ``train_clients_per_round`` and ``expected_clients_per_round``), at a
#: population of :data:`CROSS_DEVICE_CLIENTS` simulated clients.
CROSS_DEVICE_CLIENTS = 1_000
CROSS_DEVICE_POOL = 32
CROSS_DEVICE_SAMPLED = 3


def cross_device(common: Mapping[str, Any]) -> PaperComparison:
    """OCS and AOCS over the authors' available pool, ``--full`` only.

    Only the pool of 32 trains each round, so 1,000 clients cost 32 trainings
    a round; the runs are still about ten times the single-model row's
    (the population's data and node states), beyond quick mode's budget.
    """
    uniform: Overrides = {"strategy": "ocs", "ocs-uniform": True}
    return PaperComparison(
        title=f"Cross-device: {CROSS_DEVICE_CLIENTS:,} clients, pools of "
        f"{CROSS_DEVICE_POOL}, {CROSS_DEVICE_SAMPLED} sampled",
        paper="Chen, Horváth and Richtárik, TMLR 2022, Optimal client sampling "
        "for federated learning (the authors' cross-device code: pools of 32 "
        "available clients, 2-3 sampled)",
        claim="in each round's available pool, optimal client sampling reaches "
        "a target accuracy in fewer rounds than uniform sampling of the same "
        "expected number of clients",
        data=f"FedProx's Synthetic(1, 1) over {CROSS_DEVICE_CLIENTS:,} clients "
        "with its power-law sizes, logistic regression: a population the "
        "1,437 digits cannot be split into",
        comparisons=(
            Comparison(
                name="OCS over the available pool, same local step",
                shared={
                    **COMMON,
                    "num-supernodes": CROSS_DEVICE_CLIENTS,
                    "dataset": "synthetic-1-1",
                    "num-server-rounds": 60,
                    "clients-per-round": CROSS_DEVICE_SAMPLED,
                    "ocs-pool-size": CROSS_DEVICE_POOL,
                },
                methods={
                    "uniform": uniform,
                    "ocs": {"strategy": "ocs"},
                    "aocs": {"strategy": "ocs", "ocs-approximate": True},
                },
                baseline="uniform",
                claimed=("ocs", "aocs"),
                note="All three draw the same pool each round (the strategy's "
                "seeded generator) and compare the same uniforms with their "
                "probabilities, `m / n` for the control, so they differ only "
                "in the probabilities within the pool.",
            ),
        ),
        main_row=("OCS over the available pool, same local step", "ocs"),
        **common,
    )


def descriptions(full: bool) -> tuple[PaperComparison, ...]:
    """The single-model (OCS) and the multi-model (MMFL) claims.

    ``--full`` adds the cross-device claim (:func:`cross_device`).
    """
    common: dict[str, Any] = {
        "direction": "below",
        "metric": "test accuracy",
        "higher_is_better": True,
        "target": TargetRule(fraction=0.9),
        "tuning_seeds": TUNING_SEEDS,
        "reported_seeds": tuple(range(10 if full else 5)),
        # A run takes about 4 s: the main rows (OCS, MMFL-gradnorm) may rise
        # to 8 seeds in quick mode.
        "powered_seeds": 20 if full else 8,
    }
    clients = 100 if full else 40
    single_shared: dict[str, bool | int | float | str] = {
        **COMMON,
        "num-supernodes": clients,
        "dataset": "digits",
        "partitioning": "lognormal",
        "lognormal-sigma": 1.8,
        "num-server-rounds": 30 if full else 15,
        "clients-per-round": 12 if full else 6,
    }
    uniform: Overrides = {"strategy": "ocs", "ocs-uniform": True}
    exact: Overrides = {"strategy": "ocs", "ocs-approximate": False}
    single = PaperComparison(
        title=f"Single model: {clients} clients, log-normal sizes",
        paper="Chen, Horváth and Richtárik, TMLR 2022, Optimal client sampling "
        "for federated learning",
        claim="optimal client sampling has a lower update variance than uniform "
        "sampling at equal expected participation, hence reaches a target "
        "accuracy in fewer rounds",
        data=f"digits (1,437 images, 8x8) over {clients} clients with log-normal "
        "sizes (sigma 1.8), logistic regression: unequal sizes give unequal "
        "update norms, where OCS's probabilities differ from uniform",
        comparisons=(
            Comparison(
                name="OCS, same local step",
                shared=single_shared,
                methods={
                    "uniform": uniform,
                    "ocs": exact,
                    "aocs": {"strategy": "ocs", "ocs-approximate": True},
                },
                baseline="uniform",
                claimed=("ocs", "aocs"),
                note="The baseline is OCS itself at `p_i = m / N` (`ocs-uniform`): "
                "the same norm query, kept updates, unbiased `sum (d/p) U` and "
                "seeded generator, so within a seed both draw the same uniforms "
                "and a client's inclusion differs only where its probability "
                "does. AOCS matching OCS means its 4 rescalings reached (close "
                "enough to) the exact probabilities, so the same seeded draws "
                "picked the same clients.",
            ),
            Comparison(
                name="OCS, FedAdam server step",
                shared={**single_shared, **FEDADAM},
                methods={"uniform": uniform, "ocs": exact},
                baseline="uniform",
                claimed=("ocs",),
                tuned=full,
                note=fedadam_note(full),
            ),
        ),
        main_row=("OCS, same local step", "ocs"),
        # Only the FedAdam row is tuned (--full): the server step's eta.
        learning_rates=FEDADAM_ETAS,
        learning_rate_key="server-optimizer-eta",
        **common,
    )
    tasks = (
        "digits:pathological:2,digits:pathological:3,digits:pathological:4,"
        "digits:dirichlet:0.3,digits:lognormal:1.8"
        if full
        else "digits:pathological:2,digits:dirichlet:0.3,digits:lognormal:1.8"
    )
    clients = 120 if full else 40
    multi = PaperComparison(
        title=f"Multiple models: {len(tasks.split(','))} models, {clients} clients",
        paper="Zhang et al. 2024, Optimal variance-reduced client sampling in "
        "multiple models federated learning (slides and poster)",
        claim="variance-reduced client-model assignment reaches a target mean "
        "accuracy in fewer rounds than random assignment (poster: >30% higher "
        "average accuracy); the loss-based variant keeps most of the gain",
        data=f"digits at several non-IID levels, one model each, {clients} "
        "clients, logistic regression: the slides' Fashion-MNIST tasks at the "
        "size of the offline data",
        comparisons=(
            Comparison(
                name="MMFL, same local step",
                shared={
                    **COMMON,
                    "num-supernodes": clients,
                    "strategy": "mmfl",
                    "mmfl-tasks": tasks,
                    "num-server-rounds": 30 if full else 20,
                    "clients-per-round": 12 if full else 8,
                },
                methods={
                    "random": {"mmfl-variant": "random"},
                    "round-robin": {"mmfl-variant": "round-robin"},
                    "mmfl-gradnorm": {"mmfl-variant": "gradnorm"},
                    "mmfl-loss": {"mmfl-variant": "loss"},
                },
                baseline="random",
                claimed=("mmfl-gradnorm", "mmfl-loss"),
                note="MMFL-gradnorm makes every client train every model each "
                "round (the trainings column); the loss variant trains the "
                "sampled clients only.",
            ),
        ),
        main_row=("MMFL, same local step", "mmfl-gradnorm"),
        **common,
    )
    return (single, multi, cross_device(common)) if full else (single, multi)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the comparisons; write the summary, results, claims and plots."""
    args, out = start_benchmark(benchmark_parser("variance_reduced", __doc__), argv)
    run = run_function(out)
    evaluations = [
        run_comparisons(description, run, full=args.full)
        for description in descriptions(args.full)
    ]
    names = ("single-model", "multi-model", "cross-device")[: len(evaluations)]
    for evaluation, name in zip(evaluations, names, strict=True):
        evaluation.plot(out / f"{name}.png")
    summary = "\n".join(
        [
            "# Optimal variance-reduced sampling (OCS, MMFL)",
            "",
            *(evaluation.markdown(level=2) for evaluation in evaluations),
            "The variance column is measured on each round's actual updates: OCS "
            "and MMFL-gradnorm know every client's update norm, so they report "
            "the estimator's exact variance given those updates under their "
            "probabilities and under the uniform (`m / N`) or random "
            "(`m / (N S)`) ones (1 for OCS's uniform control); MMFL's loss "
            "variant and baselines never see the norms, hence n/a.",
        ]
    )
    write_outputs(out, summary, evaluations)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
