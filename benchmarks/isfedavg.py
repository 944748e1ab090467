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
seeds), final MSD (mean of the last 10% of rounds), rounds until the mean MSD
first reaches a target. Logistic (preset ``isfedavg-logistic``, K = 100): final
test error. Ratios are against FedAvg measured in the same run.

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
    markdown_table,
    prepare_run,
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
TARGET_MSD = 0.01
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


def rounds_to_target(mean_curve: np.ndarray, target: float) -> int | None:
    """First round where the mean curve is at or below ``target`` (None: never)."""
    hits = np.flatnonzero(mean_curve <= target)
    return int(hits[0]) if hits.size else None


def summarize(setting: Setting, curves: dict[str, np.ndarray]) -> MethodSummary:
    """Final values (mean ± std over seeds), rounds to target and ratios."""
    tail = max(1, int(FINAL_FRACTION * setting.rounds))
    finals = {method: runs[:, -tail:].mean(axis=1) for method, runs in curves.items()}
    summary: MethodSummary = {}
    for method, values in finals.items():
        mean_curve = curves[method].mean(axis=0)
        entry: dict[str, Any] = {
            "final_mean": float(values.mean()),
            "final_std": float(values.std()),
            "final_ratio_vs_fedavg": float(values.mean() / finals[BASELINE].mean()),
            "mean_curve": mean_curve.tolist(),
        }
        if setting.metric == "msd":
            entry["rounds_to_target"] = rounds_to_target(mean_curve, TARGET_MSD)
        summary[method] = entry
    return summary


def results_table(setting: Setting, summary: MethodSummary) -> str:
    """The setting's results as a markdown table."""
    label = "final MSD" if setting.metric == "msd" else "final test error"
    columns = ["method", f"{label} (mean ± std)", "ratio vs FedAvg"]
    if setting.metric == "msd":
        columns += [f"rounds to MSD {TARGET_MSD:g}", "ratio vs FedAvg"]
    baseline_rounds = summary[BASELINE].get("rounds_to_target")
    cells = []
    for method, entry in summary.items():
        row = [
            method,
            f"{entry['final_mean']:.4g} ± {entry['final_std']:.2g}",
            f"{entry['final_ratio_vs_fedavg']:.2f}",
        ]
        if setting.metric == "msd":
            rounds = entry["rounds_to_target"]
            ratio = (
                f"{rounds / baseline_rounds:.2f}"
                if rounds is not None and baseline_rounds
                else "n/a"
            )
            row += [str(rounds) if rounds is not None else "not reached", ratio]
        cells.append(row)
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


def verdict(setting: Setting, summary: MethodSummary) -> str:
    """An honest line comparing our numbers with the paper's claim."""
    ours, fedavg = summary["isfedavg"], summary[BASELINE]
    uniform = summary["isfedavg-uniform"]
    if setting.metric == "msd":
        ours_curve = np.array(ours["mean_curve"])
        fedavg_curve = np.array(fedavg["mean_curve"])
        below = float(np.mean(ours_curve[1:] <= fedavg_curve[1:]))
        ratio = ours["final_ratio_vs_fedavg"]
        return (
            f"Ours: ISFedAvg's mean MSD is below FedAvg's in {below:.0%} of rounds; "
            f"its final MSD is {ratio:.2f}x FedAvg's ("
            f"{'lower' if ratio < 1 else 'not lower'}) and "
            f"{ours['final_mean'] / uniform['final_mean']:.2f}x uniform ISFedAvg's. "
            "The paper's claim holds here only at the end, if at all: FedAvg's step "
            "is not divided by E_k (eq. 4 vs eq. 8), so it moves ~E_k times faster "
            "and its curve is lower early; the uniform variant isolates the effect "
            "of the probabilities from that scaling. A 'final' value still inside "
            "ISFedAvg's transient (rounds to target near the run length) is not its "
            "steady state: use --full."
        )
    return (
        f"Ours: test error FedAvg {fedavg['final_mean']:.1%}, uniform ISFedAvg "
        f"{uniform['final_mean']:.1%}, ISFedAvg {ours['final_mean']:.1%} (mean of the "
        "last 10% of rounds); the paper's data details are not all given, see "
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
        summary = summarize(setting, curves)
        elapsed = time.perf_counter() - start
        plot_path = plot(setting, summary, output_dir)
        results[setting.name] = {
            "preset": setting.preset,
            "num_clients": setting.num_clients,
            "rounds": setting.rounds,
            "seeds": list(setting.seeds),
            "seconds": elapsed,
            "methods": summary,
        }
        sections.append(
            f"## {setting.name} (preset `{setting.preset}`, K={setting.num_clients}, "
            f"{setting.rounds} rounds, seeds {list(setting.seeds)})\n\n"
            f"{results_table(setting, summary)}\n\n"
            f"Paper: {PAPER_CLAIMS[setting.name]}.\n\n{verdict(setting, summary)}\n\n"
            f"![{setting.name}]({plot_path.name})\n"
        )
    text = "# ISFedAvg benchmark\n\n" + "\n".join(sections)
    (output_dir / "summary.md").write_text(text)
    (output_dir / "results.json").write_text(json.dumps(results, indent=2))
    print(text)


if __name__ == "__main__":
    main()
