"""ISFedAvg against FedAvg on the paper's regression and logistic problems.

Three methods, same seeds, driven through the real strategies and ClientApps on
the in-process grid (:func:`simulations.inprocess.run_inprocess`):

- ``fedavg``: Flower's FedAvg, uniform client sampling and plain local SGD
  (eq. 4) with ``mu`` per step, ``E`` drawn in ``1..5`` each round, ``B = 5``
  (the means of the paper's ``E_k in [1, 5]``, ``B_k in [1, 10]``);
- ``isfedavg-uniform``: ISFedAvg with frozen uniform probabilities: the eq. 8
  step (divided by ``E_k``) without importance sampling;
- ``isfedavg``: ISFedAvg with the eq. 28-29 probabilities.

Regression (preset ``isfedavg-regression``, K = 300): MSD curve (mean over
seeds), final MSD (mean of the last 10% of rounds), rounds until each seed's MSD
first reaches ``TARGET_MSD``. Logistic (preset ``isfedavg-logistic``, K = 100):
test error curve, final test error, rounds until each seed's test error first
reaches ``TARGET_ERROR_FACTOR`` times the worst method's final mean test error.
Ratios are against FedAvg measured in the same run.

Run ``python -m benchmarks.isfedavg`` (quick) or ``--full`` (paper-scale).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt
import numpy as np

from benchmarks.harness import (
    benchmark_parser,
    finite_mean,
    format_ratio,
    markdown_table,
    mean_ratio,
    mean_std,
    prepare_run,
    rounds_to_target,
    save_figure,
)
from simulations.inprocess import load_preset, run_inprocess

METHODS: dict[str, dict[str, bool | int | float | str]] = {
    "fedavg": {
        "strategy": "fedavg",
        "local-steps": 5,
        "heterogeneous-steps": True,
        "batch-size": 5,
    },
    "isfedavg-uniform": {"strategy": "isfedavg", "isfedavg-uniform": True},
    "isfedavg": {"strategy": "isfedavg", "isfedavg-uniform": False},
}
BASELINE = "fedavg"
#: Regression target MSD, fixed: FedAvg reaches it in the quick setting.
TARGET_MSD = 0.01
#: Logistic target: this multiple of the worst method's final mean test error,
#: so that every method's mean curve ends below it. Computed from the run, as
#: the paper gives no error level to reach.
TARGET_ERROR_FACTOR = 1.5
#: Fraction of the last rounds averaged into a "final" value (curves are noisy).
FINAL_FRACTION = 0.1

#: Per method, its summary numbers and mean curve (JSON-ready).
MethodSummary = dict[str, dict[str, Any]]

PAPER_CLAIMS = {
    "regression": "MSD curve of ISFedAvg below FedAvg's (Fig. 1 left, 100 runs)",
    "logistic": "test error FedAvg ~2%, ISFedAvg ~0% (Fig. 1 right)",
}


@dataclass(frozen=True)
class Setting:
    """One problem of the benchmark."""

    name: str
    preset: str
    num_clients: int
    rounds: int
    seeds: tuple[int, ...]
    metric: str


def settings(full: bool) -> list[Setting]:
    """The quick (default) or paper-scale problems."""
    if full:
        return [
            Setting(
                "regression", "isfedavg-regression", 300, 600, tuple(range(10)), "msd"
            ),
            Setting(
                "logistic", "isfedavg-logistic", 100, 300, tuple(range(5)), "error"
            ),
        ]
    return [
        Setting("regression", "isfedavg-regression", 300, 200, (0, 1), "msd"),
        Setting("logistic", "isfedavg-logistic", 100, 50, (0, 1), "error"),
    ]


def run_curve(
    setting: Setting, method: str, seed: int, output_dir: Path
) -> list[float]:
    """The metric after every round (round 0 included) of one run."""
    overrides = {
        **load_preset(setting.preset),
        **METHODS[method],
        "num-server-rounds": setting.rounds,
        "seed": seed,
        "output-dir": str(output_dir / "runs" / f"{setting.name}-{method}-{seed}"),
    }
    rows, _ = run_inprocess(overrides, setting.num_clients)
    if setting.metric == "error":
        return [1.0 - float(row["accuracy"]) for row in rows]
    return [float(row["msd"]) for row in rows]


@dataclass(frozen=True)
class Target:
    """The value a setting's rounds to target are counted to."""

    value: float
    #: The metric and value as the table's header names them.
    label: str
    #: How the value was chosen, for the summary text.
    rule: str


def choose_target(setting: Setting, finals: dict[str, np.ndarray]) -> Target:
    """The fixed MSD target, or the logistic one from the final test errors.

    Parameters
    ----------
    setting : Setting
        The problem; its ``metric`` picks the rule.
    finals : dict[str, np.ndarray]
        Per method, each seed's final value.
    """
    if setting.metric == "msd":
        return Target(TARGET_MSD, f"MSD {TARGET_MSD:g}", f"MSD {TARGET_MSD:g} (fixed)")
    worst = max(float(values.mean()) for values in finals.values())
    value = TARGET_ERROR_FACTOR * worst
    return Target(
        value,
        f"test error {value:.2%}",
        f"test error {value:.2%} ({TARGET_ERROR_FACTOR:g}x the worst method's "
        f"final mean test error, {worst:.2%})",
    )


def summarize(
    setting: Setting, curves: dict[str, np.ndarray]
) -> tuple[Target, MethodSummary]:
    """Final values (mean ± std over seeds), per-seed rounds to target, ratios."""
    tail = max(1, int(FINAL_FRACTION * setting.rounds))
    finals = {method: runs[:, -tail:].mean(axis=1) for method, runs in curves.items()}
    target = choose_target(setting, finals)
    # Both metrics (MSD, test error) are better lower.
    rounds = {
        method: [
            rounds_to_target(curve, target.value, lower_is_better=True)
            for curve in runs
        ]
        for method, runs in curves.items()
    }
    summary: MethodSummary = {}
    for method, values in finals.items():
        summary[method] = {
            "final_mean": float(values.mean()),
            "final_std": float(values.std()),
            "final_ratio_vs_fedavg": float(values.mean() / finals[BASELINE].mean()),
            "rounds_to_target": rounds[method],
            "rounds_ratio_vs_fedavg": mean_ratio(rounds[method], rounds[BASELINE]),
            "mean_curve": curves[method].mean(axis=0).tolist(),
        }
    return target, summary


def results_table(setting: Setting, target: Target, summary: MethodSummary) -> str:
    """The setting's results as a markdown table."""
    label = "final MSD" if setting.metric == "msd" else "final test error"
    columns = [
        "method",
        f"{label} (mean ± std)",
        "ratio vs FedAvg",
        f"rounds to {target.label} (mean ± std)",
        "rounds / FedAvg",
    ]
    cells = [
        [
            method,
            f"{entry['final_mean']:.4g} ± {entry['final_std']:.2g}",
            f"{entry['final_ratio_vs_fedavg']:.2f}",
            mean_std(entry["rounds_to_target"], digits=1),
            format_ratio(entry["rounds_ratio_vs_fedavg"]),
        ]
        for method, entry in summary.items()
    ]
    return markdown_table(columns, cells)


def plot(setting: Setting, summary: MethodSummary, output_dir: Path) -> Path:
    """Mean curves of the three methods, log scale."""
    figure, axes = plt.subplots(figsize=(6, 4))
    for method, entry in summary.items():
        axes.plot(entry["mean_curve"], label=method)
    axes.set_yscale("log")
    axes.set_xlabel("round")
    axes.set_ylabel("MSD" if setting.metric == "msd" else "test error")
    axes.set_title(f"{setting.name}: mean of {len(setting.seeds)} seeds")
    axes.legend()
    path = output_dir / f"{setting.name}.png"
    save_figure(figure, path, dpi=120)
    return path


def rounds_sentence(
    target: Target, ours: dict[str, Any], uniform: dict[str, Any]
) -> str:
    """ISFedAvg's and uniform ISFedAvg's rounds to target against FedAvg's."""
    ratio = ours["rounds_ratio_vs_fedavg"]
    if not np.isfinite(ratio):
        return (
            f"ISFedAvg's rounds to {target.label} do not compare with FedAvg's: "
            "one of them reaches it in no seed."
        )
    return (
        f"To reach {target.label} ISFedAvg needs {ratio:.2f}x FedAvg's rounds "
        f"({'fewer' if ratio < 1 else 'not fewer'}), uniform ISFedAvg "
        f"{format_ratio(uniform['rounds_ratio_vs_fedavg'])}x."
    )


def verdict(setting: Setting, target: Target, summary: MethodSummary) -> str:
    """An honest line comparing our numbers with the paper's claim."""
    ours, fedavg = summary["isfedavg"], summary[BASELINE]
    uniform = summary["isfedavg-uniform"]
    ratio = ours["final_ratio_vs_fedavg"]
    scaling = (
        "FedAvg's step is not divided by E_k (eq. 4 vs eq. 8), so it moves ~E_k "
        "times faster and its curve is lower early; the uniform variant isolates "
        "the effect of the probabilities from that scaling."
    )
    if setting.metric == "msd":
        ours_curve = np.array(ours["mean_curve"])
        fedavg_curve = np.array(fedavg["mean_curve"])
        below = float(np.mean(ours_curve[1:] <= fedavg_curve[1:]))
        ours_rounds = finite_mean(ours["rounds_to_target"])
        transient = (
            f"ISFedAvg reaches {target.label} at round {ours_rounds:.0f} of "
            f"{setting.rounds} (mean over the seeds that do)"
            if np.isfinite(ours_rounds)
            else f"ISFedAvg does not reach {target.label} in {setting.rounds} rounds"
        )
        return (
            f"Ours: ISFedAvg's mean MSD is below FedAvg's in {below:.0%} of rounds; "
            f"its final MSD is {ratio:.2f}x FedAvg's ("
            f"{'lower' if ratio < 1 else 'not lower'}) and "
            f"{ours['final_mean'] / uniform['final_mean']:.2f}x uniform ISFedAvg's. "
            f"{rounds_sentence(target, ours, uniform)} The paper's curve, below "
            "FedAvg's throughout, implies fewer rounds to any target; here the "
            f"claim holds only at the end, if at all: {scaling} {transient}; a "
            "'final' value still inside ISFedAvg's transient (rounds to target "
            "near the run length) is not its steady state: use --full."
        )
    return (
        f"Ours: test error FedAvg {fedavg['final_mean']:.1%}, uniform ISFedAvg "
        f"{uniform['final_mean']:.1%}, ISFedAvg {ours['final_mean']:.1%} (mean of the "
        f"last 10% of rounds): ISFedAvg's is {ratio:.2f}x FedAvg's "
        f"({'lower, as in the paper' if ratio < 1 else 'not lower, unlike the paper'})"
        f". {rounds_sentence(target, ours, uniform)} As in the regression, {scaling} "
        "The paper's data details are not all given, see "
        "flwr_importance.tasks.generators.isfedavg_logistic."
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark; print and write the tables, JSON and plots."""
    args = benchmark_parser("isfedavg", __doc__).parse_args(argv)
    prepare_run()
    output_dir: Path = args.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"mode": "full" if args.full else "quick"}
    sections = []
    for setting in settings(args.full):
        start = time.perf_counter()
        curves = {
            method: np.array(
                [run_curve(setting, method, seed, output_dir) for seed in setting.seeds]
            )
            for method in METHODS
        }
        target, summary = summarize(setting, curves)
        elapsed = time.perf_counter() - start
        plot_path = plot(setting, summary, output_dir)
        results[setting.name] = {
            "preset": setting.preset,
            "num_clients": setting.num_clients,
            "rounds": setting.rounds,
            "seeds": list(setting.seeds),
            "seconds": elapsed,
            "target": target.value,
            "target_rule": target.rule,
            "methods": summary,
        }
        sections.append(
            f"## {setting.name} (preset `{setting.preset}`, K={setting.num_clients}, "
            f"{setting.rounds} rounds, seeds {list(setting.seeds)})\n\n"
            f"Rounds to target: first round at or below {target.rule}, per seed; "
            "the ratio divides the means over the seeds that reach it.\n\n"
            f"{results_table(setting, target, summary)}\n\n"
            f"Paper: {PAPER_CLAIMS[setting.name]}.\n\n"
            f"{verdict(setting, target, summary)}\n\n"
            f"![{setting.name}]({plot_path.name})\n"
        )
    text = "# ISFedAvg benchmark\n\n" + "\n".join(sections)
    (output_dir / "summary.md").write_text(text)
    (output_dir / "results.json").write_text(json.dumps(results, indent=2))
    print(text)


if __name__ == "__main__":
    main()
