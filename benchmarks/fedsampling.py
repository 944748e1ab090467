"""FedSampling against client-level sampling and centralized SGD (Qi et al., 2023).

For digits split over clients with log-normal sizes (each ``--sigmas`` value),
central test accuracy after ``--rounds`` rounds, mean ± std over ``--seeds``, and
the rounds each federated method needs to reach a target accuracy
(``TARGET_FRACTION`` of the best federated method's final mean at that sigma):

- ``fedavg``: Flower's FedAvg, clients drawn uniformly;
- ``sizeweighted``: clients drawn with probability proportional to their TRUE
  size (reveals the sizes);
- ``fedsampling eps=…``: FedSampling with private sizes, several ``--epsilons``;
- ``centralized``: plain SGD on the pooled partitions (``train_local``), one
  step of ``K`` samples per round, the upper reference.

Every method spends about ``K`` sample gradients per round: the client-level
baselines draw ``K / batch`` clients, each taking one local step of ``batch``
samples at learning rate ``eta``; FedSampling and centralized take one step of
``eta`` on ``K`` samples (in expectation for FedSampling). Everything runs the
real strategies and ClientApps through ``simulations.inprocess.run_inprocess``.

Run ``python -m benchmarks.fedsampling`` (quick, a few minutes on one core) or
with ``--full`` (paper-like: more clients, rounds, seeds and epsilons).
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

from benchmarks.harness import (
    benchmark_parser,
    format_ratio,
    markdown_table,
    mean_ratio,
    mean_std,
    prepare_run,
    rounds_to_target,
    save_figure,
)
from flwr_importance.tasks import Objective, evaluate, train_local
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config, run_inprocess
from simulations.task import federated_data, global_model

PAPER_CLAIM = (
    "FedSampling comes close to centralized training and beats uniform and "
    "size-weighted client sampling, more so as sigma grows (Table 1, Figs. 3-4); "
    "a smaller epsilon costs accuracy (Fig. 6)."
)

#: The target accuracy is this fraction of the best federated method's final
#: mean accuracy at each sigma. Not the usual 90%: in the quick setting that
#: lies above every round of fedavg at sigma = 4, leaving the baseline of the
#: rounds ratios without rounds.
TARGET_FRACTION = 0.85

#: The baseline of the rounds ratios: uniform client sampling.
BASELINE = "fedavg"

#: The upper reference; trained in one call, so it has no per-round curve.
CENTRALIZED = "centralized"


@dataclass(frozen=True)
class Setting:
    """What one benchmark run covers."""

    num_clients: int
    rounds: int
    seeds: tuple[int, ...]
    sigmas: tuple[float, ...]
    epsilons: tuple[float, ...]
    samples_per_round: int
    batch_size: int
    server_lr: float
    max_size: int
    model: str


def method_overrides(
    setting: Setting, method: str, epsilon: float | None
) -> dict[str, bool | int | float | str]:
    """Run-config overrides of one method, sample budget matched."""
    if method == "fedsampling":
        assert epsilon is not None
        return {
            "strategy": "fedsampling",
            "fedsampling-samples-per-round": setting.samples_per_round,
            "fedsampling-epsilon": epsilon,
            "fedsampling-max-size": setting.max_size,
            "fedsampling-server-lr": setting.server_lr,
        }
    return {
        "strategy": method,
        "clients-per-round": setting.samples_per_round // setting.batch_size,
        "local-steps": 1,
        "local-lr": setting.server_lr,
    }


def federated_accuracy(
    setting: Setting,
    sigma: float,
    seed: int,
    method: str,
    epsilon: float | None,
    runs_dir: Path,
) -> tuple[list[float], list[float]]:
    """One federated run: its accuracy curve and its size estimates.

    Parameters
    ----------
    setting : Setting
        The benchmark's setting.
    sigma : float
        The log-normal sigma of the client sizes.
    seed : int
        The run's seed.
    method : str
        ``"fedavg"``, ``"sizeweighted"`` or ``"fedsampling"``.
    epsilon : float or None
        FedSampling's privacy budget (``None`` for the other methods).
    runs_dir : Path
        The run writes its history and plot to a folder under it.

    Returns
    -------
    tuple of list of float
        Central test accuracy after every round, round 0 (the initial model)
        first and the final accuracy last; FedSampling's raw estimates of the
        pooled size, one per round (empty for the other methods).
    """
    label = method if epsilon is None else f"{method}-eps{epsilon:g}"
    overrides = {
        "dataset": "digits",
        "partitioning": "lognormal",
        "lognormal-sigma": sigma,
        "model": setting.model,
        "num-server-rounds": setting.rounds,
        "batch-size": setting.batch_size,
        "seed": seed,
        "output-dir": str(runs_dir / f"{label}-s{sigma:g}-{seed}"),
        **method_overrides(setting, method, epsilon),
    }
    rows, _ = run_inprocess(overrides, setting.num_clients)
    estimates = [row["raw-size-estimate"] for row in rows if "raw-size-estimate" in row]
    return [row["accuracy"] for row in rows], estimates


def centralized_accuracy(setting: Setting, sigma: float, seed: int) -> float:
    """Plain SGD on the pooled partitions: one step of ``K`` samples a round."""
    config = ExperimentConfig.from_run_config(
        resolve_run_config(
            {
                "dataset": "digits",
                "partitioning": "lognormal",
                "lognormal-sigma": sigma,
                "model": setting.model,
                "seed": seed,
            }
        )
    )
    data = federated_data(config, setting.num_clients)
    model = global_model(config, data)
    objective = Objective(data.task, l2=config.l2)
    x = torch.cat([partition.x for partition in data.partitions])
    y = torch.cat([partition.y for partition in data.partitions])
    train_local(
        model,
        x,
        y,
        objective,
        lr=setting.server_lr,
        batch_size=setting.samples_per_round,
        local_steps=setting.rounds,
        generator=torch.Generator().manual_seed(seed),
    )
    return evaluate(model, data.test.x, data.test.y, objective)["accuracy"]


def true_total(setting: Setting, sigma: float, seed: int) -> tuple[int, int]:
    """The pooled size and the size FedSampling estimates (clipped to M - 1)."""
    config = ExperimentConfig.from_run_config(
        resolve_run_config(
            {
                "dataset": "digits",
                "partitioning": "lognormal",
                "lognormal-sigma": sigma,
                "seed": seed,
            }
        )
    )
    sizes = federated_data(config, setting.num_clients).partition_sizes
    return int(sizes.sum()), int(np.minimum(sizes, setting.max_size - 1).sum())


def run(setting: Setting, runs_dir: Path) -> dict[str, object]:
    """Every method, sigma and seed: accuracies, rounds to target, size errors.

    Parameters
    ----------
    setting : Setting
        What to run.
    runs_dir : Path
        Where the federated runs write their histories and plots.

    Returns
    -------
    dict of str to object
        Each key maps every sigma (as ``f"{sigma:g}"``) to: ``"accuracy"``,
        each method's final accuracy per seed; ``"accuracy_curves"``, each
        federated method's per-round curve per seed; ``"target"``, the target
        accuracy; ``"rounds_to_target"``, each federated method's rounds per
        seed (NaN where a seed never reaches the target); ``"pooled_size"``, the
        pooled size per seed; ``"estimate_rms_relative_error"``, the rms
        relative error of each FedSampling variant's size estimates, and
        (``"<variant> clipping"``) the error that clipping at ``M - 1`` alone
        makes.
    """
    methods: list[tuple[str, float | None]] = [(BASELINE, None), ("sizeweighted", None)]
    methods += [("fedsampling", epsilon) for epsilon in setting.epsilons]
    results: dict[str, dict[str, list[float]]] = {}
    curves: dict[str, dict[str, list[list[float]]]] = {}
    targets: dict[str, float] = {}
    rounds: dict[str, dict[str, list[float]]] = {}
    pooled_sizes: dict[str, list[int]] = {}
    estimate_errors: dict[str, dict[str, float]] = {}
    for sigma in setting.sigmas:
        key = f"{sigma:g}"
        results[key] = {CENTRALIZED: []}
        curves[key] = {}
        pooled_sizes[key] = []
        errors: dict[str, list[float]] = {}
        for seed in setting.seeds:
            results[key][CENTRALIZED].append(centralized_accuracy(setting, sigma, seed))
            total, clipped_total = true_total(setting, sigma, seed)
            pooled_sizes[key].append(total)
            for method, epsilon in methods:
                name = method if epsilon is None else f"fedsampling eps={epsilon:g}"
                curve, estimates = federated_accuracy(
                    setting, sigma, seed, method, epsilon, runs_dir
                )
                curves[key].setdefault(name, []).append(curve)
                results[key].setdefault(name, []).append(curve[-1])
                if estimates:
                    errors.setdefault(name, []).extend(
                        (np.array(estimates) / total - 1).tolist()
                    )
                    errors.setdefault(f"{name} clipping", []).append(
                        clipped_total / total - 1
                    )
        estimate_errors[key] = {
            name: float(np.sqrt(np.mean(np.square(values))))
            for name, values in errors.items()
        }
        targets[key] = TARGET_FRACTION * max(
            float(np.mean(results[key][name])) for name in curves[key]
        )
        rounds[key] = {
            name: [rounds_to_target(curve, targets[key]) for curve in seed_curves]
            for name, seed_curves in curves[key].items()
        }
    return {
        "accuracy": results,
        "accuracy_curves": curves,
        "target": targets,
        "rounds_to_target": rounds,
        "pooled_size": pooled_sizes,
        "estimate_rms_relative_error": estimate_errors,
    }


def rounds_ratio(rounds: dict[str, list[float]], name: str) -> float:
    """Mean rounds to target of ``name`` over those of :data:`BASELINE`."""
    return mean_ratio(rounds[name], rounds[BASELINE])


def summarize(setting: Setting, outcome: dict[str, object]) -> str:
    """Markdown tables per sigma: accuracy, rounds to target, ratios; the claim."""
    accuracy: dict[str, dict[str, list[float]]] = outcome["accuracy"]  # type: ignore[assignment]
    targets: dict[str, float] = outcome["target"]  # type: ignore[assignment]
    rounds: dict[str, dict[str, list[float]]] = outcome["rounds_to_target"]  # type: ignore[assignment]
    pooled_sizes: dict[str, list[int]] = outcome["pooled_size"]  # type: ignore[assignment]
    errors: dict[str, dict[str, float]] = outcome["estimate_rms_relative_error"]  # type: ignore[assignment]
    lines = [
        "# FedSampling benchmark",
        "",
        f"digits, log-normal sizes, {setting.num_clients} clients, model "
        f"`{setting.model}`, {setting.rounds} rounds, K = {setting.samples_per_round}"
        f" samples per round, eta = {setting.server_lr}, M = {setting.max_size}, "
        f"seeds {list(setting.seeds)}. Central test accuracy after the last round, "
        "mean ± std over seeds.",
        "",
        f"Rounds to target: the first round whose central test accuracy reaches "
        f"the target, {TARGET_FRACTION:.0%} of the best federated method's final "
        "mean accuracy at that sigma (its value under each table), per seed, "
        f"mean ± std over the seeds that reach it; rounds / {BASELINE} is the "
        f"ratio of those means to {BASELINE}'s. {CENTRALIZED} is trained in one "
        "call and evaluated once, so it has no rounds.",
        "",
    ]
    columns = [
        "method",
        "accuracy",
        f"/ {CENTRALIZED}",
        f"- {BASELINE}",
        "rounds to target",
        f"rounds / {BASELINE}",
        "N_tilde rms rel. error",
    ]
    for sigma, by_method in accuracy.items():
        reference = float(np.mean(by_method[CENTRALIZED]))
        uniform = float(np.mean(by_method[BASELINE]))
        cells = []
        for name, values in by_method.items():
            mean = float(np.mean(values))
            error = errors[sigma].get(name)
            reached = rounds[sigma].get(name)
            cells.append(
                [
                    name,
                    mean_std(values),
                    f"{mean / reference:.2f}",
                    f"{mean - uniform:+.3f}",
                    "" if reached is None else mean_std(reached, digits=1),
                    ""
                    if reached is None
                    else format_ratio(rounds_ratio(rounds[sigma], name)),
                    "" if error is None else f"{error:.2f}",
                ]
            )
        best = max(rounds[sigma], key=lambda name: float(np.mean(by_method[name])))
        lines += [
            f"## sigma = {sigma}",
            "",
            markdown_table(columns, cells),
            "",
            f"Target accuracy {targets[sigma]:.3f}: {TARGET_FRACTION:.0%} of "
            f"{best}'s final mean {float(np.mean(by_method[best])):.3f}.",
        ]
        clipping = next(
            (v for k, v in errors[sigma].items() if k.endswith("clipping")), None
        )
        if clipping is not None:
            lines += [
                "",
                f"Clipping sizes at M - 1 alone makes the estimated total "
                f"{clipping:.0%} off the true pooled size (rms over seeds).",
            ]
        lines.append("")
    lines += [
        "## Paper vs. this run",
        "",
        f"Paper: {PAPER_CLAIM}",
        "",
        verdict(accuracy, rounds, max(max(sizes) for sizes in pooled_sizes.values())),
    ]
    return "\n".join(lines)


def verdict(
    accuracy: dict[str, dict[str, list[float]]],
    rounds: dict[str, dict[str, list[float]]],
    pooled_size: int,
) -> str:
    """An honest line on where this run agrees with the paper and where not.

    Parameters
    ----------
    accuracy : dict
        Per sigma, each method's final accuracy per seed.
    rounds : dict
        Per sigma, each federated method's rounds to target per seed.
    pooled_size : int
        The largest pooled training set of any run.
    """
    statements = []
    private_ratios = []
    ahead_in_accuracy = []
    ahead_in_rounds = []
    for sigma, by_method in accuracy.items():
        means = {name: float(np.mean(values)) for name, values in by_method.items()}
        best_private = max(
            (name for name in means if name.startswith("fedsampling")),
            key=means.__getitem__,
        )
        baseline = max(means[BASELINE], means["sizeweighted"])
        private_ratio = rounds_ratio(rounds[sigma], best_private)
        weighted_ratio = rounds_ratio(rounds[sigma], "sizeweighted")
        private_ratios.append(private_ratio)
        if means[best_private] > baseline:
            ahead_in_accuracy.append(sigma)
        # Ahead in rounds: fewer than both client-level methods (fedavg's ratio
        # is 1 by definition).
        if private_ratio < min(1.0, weighted_ratio):
            ahead_in_rounds.append(sigma)
        statements.append(
            f"sigma={sigma}: best FedSampling ({best_private}) "
            f"{means[best_private]:.3f} vs best client-level {baseline:.3f} vs "
            f"{CENTRALIZED} {means[CENTRALIZED]:.3f}; rounds to target / {BASELINE}: "
            f"{best_private} {format_ratio(private_ratio)}, sizeweighted "
            f"{format_ratio(weighted_ratio)}"
        )
    ratio_falls = all(
        later < earlier for earlier, later in itertools.pairwise(private_ratios)
    )
    return (
        "Ours: "
        + "; ".join(statements)
        + ". The best FedSampling ends above both client-level methods "
        + at_sigmas(ahead_in_accuracy)
        + " and reaches the target in fewer rounds than both "
        + at_sigmas(ahead_in_rounds)
        + f" (of sigma = {', '.join(accuracy)}); its rounds ratio to {BASELINE} "
        + ("falls" if ratio_falls else "does not fall steadily")
        + " as sigma grows ("
        + " -> ".join(format_ratio(ratio) for ratio in private_ratios)
        + "), "
        + ("as in" if ratio_falls else "unlike")
        + " the paper's growing advantage. Where FedSampling falls short, the size "
        "estimate is the cause: its noise scales like sqrt(|C|) M / alpha, and the "
        f"pooled digits hold only {pooled_size:,} samples, so at small epsilon "
        "N_tilde is off by a large fraction (last column) and every round's step "
        "is scaled by N / N_tilde; the paper's data sets hold 10^5-10^6 samples, "
        "where the same noise is a few percent. Where FedSampling beats "
        f"{CENTRALIZED} or needs fewer rounds than the client-level methods at "
        "large sigma, clipping at M - 1 is a cause: it undercounts N (see the "
        "clipping lines), so the effective step eta N / N_tilde exceeds the "
        "others' eta and a short run gets further; that share of the gain is a "
        "larger learning rate, not better sampling."
    )


def at_sigmas(sigmas: Sequence[str]) -> str:
    """``"at sigma = 2, 4"``, or ``"at no sigma"`` for none."""
    return f"at sigma = {', '.join(sigmas)}" if sigmas else "at no sigma"


def plot(outcome: dict[str, object], path: Path) -> None:
    """Accuracy against sigma, one line per method."""
    accuracy: dict[str, dict[str, list[float]]] = outcome["accuracy"]  # type: ignore[assignment]
    sigmas = list(accuracy)
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name in accuracy[sigmas[0]]:
        means = [np.mean(accuracy[s][name]) for s in sigmas]
        stds = [np.std(accuracy[s][name]) for s in sigmas]
        axes.errorbar(
            [float(s) for s in sigmas],
            means,
            yerr=stds,
            marker="o",
            capsize=3,
            label=name,
        )
    axes.set(xlabel="log-normal sigma", ylabel="central test accuracy")
    axes.legend(fontsize=8)
    save_figure(figure, path)


def parse_setting(argv: Sequence[str] | None) -> tuple[Setting, Path]:
    """The command line: quick defaults, ``--full`` for paper-like runs."""
    args = benchmark_parser("fedsampling", __doc__).parse_args(argv)
    if args.full:
        setting = Setting(
            100,
            80,
            (0, 1, 2, 3, 4),
            (1.0, 2.0, 4.0),
            (1.0, 3.0, 10.0, 50.0),
            64,
            16,
            0.5,
            100,
            "mlp",
        )
    else:
        setting = Setting(
            30, 25, (0, 1), (1.0, 2.0, 4.0), (3.0, 50.0), 64, 16, 0.5, 100, "logreg"
        )
    return setting, args.output_dir


def main(argv: Sequence[str] | None = None) -> None:
    """Run, print and write ``results.json``, ``summary.md`` and the plot."""
    prepare_run()
    setting, output_dir = parse_setting(argv)
    output_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    outcome = run(setting, output_dir / "runs")
    elapsed = time.perf_counter() - start
    summary = summarize(setting, outcome)
    (output_dir / "results.json").write_text(
        json.dumps(
            {"setting": setting.__dict__, "seconds": elapsed, **outcome}, indent=1
        )
    )
    (output_dir / "summary.md").write_text(summary + "\n")
    plot(outcome, output_dir / "accuracy_vs_sigma.png")
    print(summary)
    print(f"\n({math.ceil(elapsed)} s; written to {output_dir})")


if __name__ == "__main__":
    main()
