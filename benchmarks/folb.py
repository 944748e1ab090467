"""FOLB against FedAvg and FedProx: loss, accuracy and rounds to a target accuracy.

Runs the real strategies and ClientApps of the simulation app on the in-process
grid, with the ``folb-*`` presets (same data, model, ``K``, seeds and per-node
random local step counts for every method), and reports, per data set, the
global training loss and test accuracy after the last round and the rounds to
reach a target accuracy, mean ± std over seeds and as ratios to FedProx measured
in the same run, beside the paper's Table I.

    python -m benchmarks.folb            # quick: 2 seeds, short runs (~3 min)
    python -m benchmarks.folb --full     # 5 seeds, 200/100 rounds, Synthetic_iid too

The target accuracy follows the paper's rule ("the maximum accuracy that all
three algorithms can reach"): the smallest, over FedAvg, FedProx and FOLB, of
the best seed-mean test accuracy, times ``TARGET_FRACTION`` so single noisy
seeds can reach it too.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
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
    finite_mean,
    markdown_table,
    mean_ratio,
    mean_std,
    prepare_run,
    rounds_to_target,
    save_figure,
)
from flwr_importance.tasks import Objective, evaluate
from flwr_importance.testing import InProcessGrid
from simulations.client_app import app as client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import load_preset, resolve_run_config
from simulations.methods import load_method
from simulations.report import history_rows
from simulations.task import federated_data, global_model

NUM_CLIENTS = 30
PSI_GRID = (0.001, 0.01, 0.1, 1.0)
# Quick mode leaves out psi = 0.001, indistinguishable from psi = 0 here.
QUICK_PSI_GRID = (0.01, 0.1, 1.0)
TARGET_FRACTION = 0.95
#: Rounds ratios within this of 1 count as "as many rounds": a round or two
#: either way over a few seeds is noise.
SAME_ROUNDS = 0.1
# Paper Table I, rounds to target accuracy: (FOLB, FedProx, FedAvg). Our
# "digits" stands in for the paper's MNIST (offline; 8x8 digits, 30 devices).
PAPER_ROUNDS = {
    "synthetic-1-1": (19, 154, 177),
    "synthetic-iid": (50, 57, 113),
    "digits": (11, 25, 25),
}
PAPER_NAMES = {
    "synthetic-1-1": "Synthetic(1,1)",
    "synthetic-iid": "Synthetic_iid",
    "digits": "MNIST",
}


DIFFERENCES = [
    "Why ours may differ from the paper: the paper's formulas were lost and "
    "FOLB-EQUATIONS.md recovers them (eq. 13 as `c_k / sum |c_i|`, flipping "
    "negative devices); 'digits' (8x8, 30 devices, 2 digits each, MLP) stands in "
    "for MNIST (1,000 devices, logistic regression); quick mode runs far fewer "
    "rounds than Table I, so its target accuracy is lower; FedAvg/FedProx draw "
    "their clients with Flower's `random` and FOLB with its own seeded generator "
    "(same seeds, different sets); the psi line search picks on the seeds it "
    "reports (in-sample). The local SGD solve often ends with gamma_k >= 1 "
    "(clipped), so eq. 18's penalty is nearly uniform; with psi * gamma_k >= 1 "
    "the norm-product penalty makes every score <= 0 (Cauchy-Schwarz) and all "
    "updates are subtracted, which is why psi = 1 fails.",
    "Checked for a bug (issue 11): `aggregation/folb.py` and `strategies/folb.py` "
    "follow FOLB-EQUATIONS.md (gS the multiset mean of the g_j, c_k = <g_k, gS>, "
    "weights m_k c_k / sum_i m_i |c_i|, negative scores flipped, g_k taken before "
    "training, gamma_k from the FedProx objective); none found. With eq. 13 the "
    "weights' absolute values sum to 1, so FOLB's step has FedAvg's scale and only "
    "re-weights the same K updates; in our short runs with a small lr (gamma_k "
    "near 1) that makes Table I's 5-8x fewer rounds than FedProx unlikely.",
]


@dataclass(frozen=True)
class Variant:
    """One compared method: a preset and run-config overrides."""

    label: str
    preset_suffix: str
    overrides: dict[str, float]


def variants(psi_grid: Sequence[float]) -> list[Variant]:
    """FedAvg, FedProx, FOLB (eq. 13) and FOLB eq. 18 over ``psi_grid``."""
    return [
        Variant("FedAvg", "-fedavg", {}),
        Variant("FedProx", "-fedprox", {}),
        Variant("FOLB", "", {}),
        *[Variant(f"FOLB psi={psi:g}", "", {"folb-psi": psi}) for psi in psi_grid],
    ]


def run_once(
    dataset: str, variant: Variant, rounds: int, seed: int
) -> dict[str, list[float]]:
    """One seeded run: per round, test accuracy, global training loss, fallbacks."""
    run_config = resolve_run_config(
        {
            **load_preset(f"folb-{dataset}{variant.preset_suffix}"),
            **variant.overrides,
            "num-server-rounds": rounds,
            "seed": seed,
        }
    )
    config = ExperimentConfig.from_run_config(run_config)
    random.seed(seed)  # Flower's stock strategies sample with `random`
    data = federated_data(config, NUM_CLIENTS)
    model = global_model(config, data)
    objective = Objective(data.task, l2=config.l2)
    train_x = torch.cat([partition.x for partition in data.partitions])
    train_y = torch.cat([partition.y for partition in data.partitions])

    def central_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        test = evaluate(model, data.test.x, data.test.y, objective)
        # f(w) = sum_k (n_k / n) F_k(w): the pooled training loss.
        train = evaluate(model, train_x, train_y, objective)
        return MetricRecord({"accuracy": test["accuracy"], "train-loss": train["loss"]})

    grid = InProcessGrid(client_app, NUM_CLIENTS, run_config, seed=seed)
    strategy = load_method(config.strategy).build_strategy(config, NUM_CLIENTS)
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=rounds,
        evaluate_fn=central_evaluate,
    )
    rows = history_rows(result)
    return {
        "accuracy": [row["accuracy"] for row in rows],
        "train-loss": [row["train-loss"] for row in rows],
        "fallback-rounds": [float(sum(row.get("folb-fallback", 0.0) for row in rows))],
    }


def summarize(
    dataset: str, runs: dict[str, list[dict[str, list[float]]]]
) -> tuple[dict[str, Any], list[str]]:
    """Per-method numbers and the summary's markdown lines for one data set."""
    mean_accuracy = {
        label: np.mean([run["accuracy"] for run in seed_runs], axis=0)
        for label, seed_runs in runs.items()
    }
    target = TARGET_FRACTION * min(
        float(mean_accuracy[label].max()) for label in ("FedAvg", "FedProx", "FOLB")
    )
    methods: dict[str, dict[str, Any]] = {
        label: {
            "train-loss": [run["train-loss"][-1] for run in seed_runs],
            "accuracy": [run["accuracy"][-1] for run in seed_runs],
            "rounds-to-target": [
                rounds_to_target(run["accuracy"], target) for run in seed_runs
            ],
            "fallback-rounds": [run["fallback-rounds"][0] for run in seed_runs],
        }
        for label, seed_runs in runs.items()
    }
    baseline = methods["FedProx"]
    columns = [
        "method",
        "train loss",
        "test accuracy",
        "rounds to target",
        "ratio loss",
        "ratio accuracy",
        "ratio rounds",
        "fallback rounds",
    ]
    cells = []
    for label, entry in methods.items():
        for key in ("train-loss", "accuracy", "rounds-to-target"):
            entry[f"ratio-{key}"] = mean_ratio(entry[key], baseline[key])
        cells.append(
            [
                label,
                mean_std(entry["train-loss"], missing="non-finite"),
                mean_std(entry["accuracy"]),
                mean_std(entry["rounds-to-target"], digits=1, missing="never reached"),
                f"{entry['ratio-train-loss']:.2f}",
                f"{entry['ratio-accuracy']:.2f}",
                f"{entry['ratio-rounds-to-target']:.2f}",
                mean_std(entry["fallback-rounds"], digits=0),
            ]
        )
    lines = [
        f"### {dataset} (target accuracy {target:.3f})",
        "",
        markdown_table(columns, cells),
    ]
    best_psi = min(
        (label for label in methods if "psi" in label),
        key=lambda label: finite_mean(methods[label]["train-loss"]),
    )
    folb, fedprox, fedavg = PAPER_ROUNDS[dataset]
    folb_ratio = methods["FOLB"]["ratio-rounds-to-target"]
    if not np.isfinite(folb_ratio):
        verdict = "no ratio of ours: FOLB or FedProx never reached the target"
    elif folb_ratio < 1 - SAME_ROUNDS:
        verdict = "FOLB needs fewer rounds than FedProx, as in the paper"
    elif folb_ratio <= 1 + SAME_ROUNDS:
        verdict = (
            f"FOLB needs as many rounds as FedProx (within {SAME_ROUNDS:.0%}), "
            "unlike the paper (why: below)"
        )
    else:
        verdict = "FOLB needs more rounds than FedProx, unlike the paper (why: below)"
    lines += [
        "",
        f"Rounds to target / FedProx's, paper ({PAPER_NAMES[dataset]}, Table I: "
        f"{folb} / {fedprox} / {fedavg}) vs ours: "
        f"FOLB {folb / fedprox:.2f} vs {folb_ratio:.2f} "
        f"({best_psi}, the psi with the lowest loss: "
        f"{methods[best_psi]['ratio-rounds-to-target']:.2f}); "
        f"FedAvg {fedavg / fedprox:.2f} vs "
        f"{methods['FedAvg']['ratio-rounds-to-target']:.2f}. Ours: {verdict}.",
        "",
    ]
    return {"target-accuracy": target, "best-psi": best_psi, "methods": methods}, lines


def plot(
    dataset: str, runs: dict[str, list[dict[str, list[float]]]], path: Path
) -> None:
    """Seed-mean test accuracy and training loss per round, one line per method."""
    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(11, 4))
    for label, seed_runs in runs.items():
        style = "-" if label in ("FedAvg", "FedProx", "FOLB") else ":"
        loss_axes.plot(
            np.mean([r["train-loss"] for r in seed_runs], axis=0), style, label=label
        )
        accuracy_axes.plot(np.mean([r["accuracy"] for r in seed_runs], axis=0), style)
    loss_axes.set(xlabel="round", ylabel="global training loss", yscale="log")
    accuracy_axes.set(xlabel="round", ylabel="test accuracy")
    loss_axes.legend(fontsize=7)
    figure.suptitle(
        f"FOLB vs FedProx vs FedAvg on {dataset} ({NUM_CLIENTS} devices, K=10)"
    )
    save_figure(figure, path)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the comparison and write ``results.json``, ``summary.md`` and plots."""
    args = benchmark_parser("folb", __doc__).parse_args(argv)
    prepare_run()
    psi_grid: Sequence[float]
    if args.full:
        seeds, psi_grid = list(range(5)), PSI_GRID
        rounds = {"synthetic-1-1": 200, "synthetic-iid": 200, "digits": 100}
    else:
        seeds, psi_grid = [0, 1], QUICK_PSI_GRID
        rounds = {"synthetic-1-1": 30, "digits": 20}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"seeds": seeds, "rounds": rounds, "datasets": {}}
    summary = [
        "# FOLB benchmark",
        "",
        f"{NUM_CLIENTS} devices, K = 10 uniform draws per round, local steps drawn "
        "in 1..20 per device and round (identical for every method), seeds "
        f"{seeds}; FedProx mu = 1, FOLB mu = 0.01. Ratios are to FedProx in this "
        "run (rounds: mean over the seeds that reached the target). Target "
        f"accuracy: {TARGET_FRACTION:.0%} of the lowest, over FedAvg, FedProx and "
        "FOLB, of the best seed-mean test accuracy (Table I's rule: the highest "
        "accuracy all three reach), so single noisy seeds can reach it too.",
        "",
    ]
    started = time.perf_counter()
    for dataset, num_rounds in rounds.items():
        runs = {
            variant.label: [
                run_once(dataset, variant, num_rounds, seed) for seed in seeds
            ]
            for variant in variants(psi_grid)
        }
        numbers, lines = summarize(dataset, runs)
        results["datasets"][dataset] = {"runs": runs, **numbers}
        plot(dataset, runs, args.output_dir / f"{dataset}.png")
        summary += lines
        print("\n".join(lines), flush=True)
    # The time is printed, not written: summary.md must not vary between runs.
    summary += DIFFERENCES
    (args.output_dir / "results.json").write_text(json.dumps(results, indent=1))
    (args.output_dir / "summary.md").write_text("\n".join(summary) + "\n")
    print(
        "\n".join(
            [*DIFFERENCES, "", f"Total time {time.perf_counter() - started:.0f} s."]
        )
    )


if __name__ == "__main__":
    main()
